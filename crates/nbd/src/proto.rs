//! NBD wire format: constants, request parsing and reply encoding (the `doc/proto.md` of
//! NetworkBlockDevice/nbd). Everything here is a pure function of
//! bytes, so the fuzz target drives it directly; every length is checked before anything is
//! allocated from it.
//!
//! All integers are big-endian on the wire.

/// "NBDMAGIC".
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": starts every option the client sends.
pub const OPTS_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Starts every option reply.
pub const REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR | 3;
/// Refused until the client starts TLS (`--tls require`).
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR | 6;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR | 9;

/// Info types (OPT_INFO / OPT_GO).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// `base:allocation` extent flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context served, and the id it gets.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
pub const META_BASE_ALLOCATION_ID: u32 = 1;

/// Errors a reply may carry (the only values clients understand).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Limits enforced before anything is allocated.
pub const OPTION_BYTES_MAX: u32 = 64 << 10;
/// Option data above this is not even drained: the client is cut off.
pub const OPTION_BYTES_DRAIN_MAX: u32 = 1 << 20;
pub const NAME_BYTES_MAX: usize = 4096;
/// Largest read or write payload (advertised as the maximum block size).
pub const PAYLOAD_BYTES_MAX: u32 = 32 << 20;
/// A write payload above the maximum is drained and refused up to this size; beyond it the
/// connection is closed.
pub const PAYLOAD_DRAIN_MAX: u32 = 64 << 20;
/// Smallest block advertised: requests must be aligned to it.
pub const BLOCK_BYTES_MIN: u32 = 512;
/// Options one connection may send before it must choose an export.
pub const OPTIONS_MAX: u32 = 256;

pub const REQUEST_BYTES: usize = 28;

/// A request header as sent by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

/// A request header that cannot be answered: the connection must close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadMagic(pub u32);

impl Request {
    pub fn parse(bytes: &[u8; REQUEST_BYTES]) -> Result<Request, BadMagic> {
        let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic != REQUEST_MAGIC {
            return Err(BadMagic(magic));
        }
        Ok(Request {
            flags: u16::from_be_bytes([bytes[4], bytes[5]]),
            kind: u16::from_be_bytes([bytes[6], bytes[7]]),
            cookie: be_u64(&bytes[8..16]),
            offset: be_u64(&bytes[16..24]),
            len: u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut out = [0u8; REQUEST_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.len
        } else {
            0
        }
    }
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(buf)
}

/// What is wrong with a request, as the error the client gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal(pub u32);

/// What the connection negotiated, for checking requests.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub size_bytes: u64,
    pub structured: bool,
    pub meta_context: bool,
}

/// Checks a request's command, flags, range and alignment, by the NBD spec's rules.
/// Zero-length requests pass: they succeed with no effect.
pub fn check(request: &Request, limits: &Limits) -> Result<(), Refusal> {
    // Every export advertises SEND_FUA, and the spec then lets a client set FUA on any command:
    // the server must accept it and may ignore it where it means nothing (READ, BLOCK_STATUS;
    // a FLUSH is durable anyway). Older qemu sends FLUSH with FUA, so refusing it broke them.
    let allowed = CMD_FLAG_FUA
        | match request.kind {
            CMD_READ => {
                if limits.structured {
                    CMD_FLAG_DF
                } else {
                    0
                }
            }
            CMD_WRITE | CMD_TRIM | CMD_FLUSH => 0,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS if limits.structured && limits.meta_context => CMD_FLAG_REQ_ONE,
            _ => return Err(Refusal(EINVAL)),
        };
    if request.flags & !allowed != 0 {
        return Err(Refusal(EINVAL));
    }
    if request.kind == CMD_FLUSH {
        return if request.offset == 0 && request.len == 0 { Ok(()) } else { Err(Refusal(EINVAL)) };
    }
    let Some(end) = request.offset.checked_add(u64::from(request.len)) else {
        return Err(Refusal(EINVAL));
    };
    if end > limits.size_bytes {
        // Writing past the end is "no space"; reading, trimming or asking about it is invalid.
        return Err(Refusal(match request.kind {
            CMD_WRITE | CMD_WRITE_ZEROES => ENOSPC,
            _ => EINVAL,
        }));
    }
    if request.kind == CMD_BLOCK_STATUS {
        // Any range is fine to ask about: the answer is rounded to whole sectors.
        return if request.len == 0 { Err(Refusal(EINVAL)) } else { Ok(()) };
    }
    let min = u64::from(BLOCK_BYTES_MIN);
    if request.offset % min != 0 || u64::from(request.len) % min != 0 {
        return Err(Refusal(EINVAL));
    }
    if matches!(request.kind, CMD_READ | CMD_WRITE) && request.len > PAYLOAD_BYTES_MAX {
        return Err(Refusal(EINVAL));
    }
    Ok(())
}

/// Encodes an option reply header and its data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&REP_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// An error option reply with a message for people.
pub fn option_error(option: u32, kind: u32, message: &str) -> Vec<u8> {
    option_reply(option, kind, message.as_bytes())
}

/// A simple reply header (for READ, the data follows).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header; `len` bytes of chunk payload follow.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
    out
}

/// A structured error chunk (final).
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(1024)];
    let mut out = Vec::with_capacity(26 + message.len());
    out.extend_from_slice(&chunk_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + message.len() as u32,
    ));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A cursor over option data that refuses to read past its end.
#[derive(Debug)]
pub struct OptionData<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> OptionData<'a> {
    pub fn new(bytes: &'a [u8]) -> OptionData<'a> {
        OptionData { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A string preceded by its u32 length, at most `NAME_BYTES_MAX` bytes of UTF-8.
    pub fn string(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        if len > NAME_BYTES_MAX {
            return None;
        }
        let bytes = self.take(len)?;
        let text = std::str::from_utf8(bytes).ok()?;
        (!text.contains('\0')).then(|| text.to_owned())
    }

    pub fn is_done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// The data of OPT_INFO / OPT_GO: the export name and the info types asked for.
pub fn parse_go(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let mut d = OptionData::new(data);
    let name = d.string()?;
    let count = d.u16()?;
    let mut requests = Vec::new();
    for _ in 0..count {
        requests.push(d.u16()?);
    }
    d.is_done().then_some((name, requests))
}

/// The data of OPT_LIST_META_CONTEXT / OPT_SET_META_CONTEXT: export name and queries.
pub fn parse_meta_context(data: &[u8]) -> Option<(String, Vec<String>)> {
    let mut d = OptionData::new(data);
    let name = d.string()?;
    let count = d.u32()?;
    let mut queries = Vec::new();
    for _ in 0..count {
        queries.push(d.string()?);
    }
    d.is_done().then_some((name, queries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { size_bytes: 1 << 20, structured: true, meta_context: true }
    }

    fn request(kind: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, kind, cookie: 7, offset, len }
    }

    #[test]
    fn requests_round_trip_and_bad_magic_is_caught() {
        let r = request(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        assert_eq!(Request::parse(&r.encode()), Ok(r));
        let mut bytes = r.encode();
        bytes[0] ^= 1;
        assert!(Request::parse(&bytes).is_err());
    }

    /// The spec's request rules, one by one.
    #[test]
    fn checks_follow_the_spec() {
        let l = limits();
        assert_eq!(check(&request(CMD_READ, 0, 0, 4096), &l), Ok(()));
        assert_eq!(check(&request(CMD_READ, 0, 0, 0), &l), Ok(()), "zero length succeeds");
        assert_eq!(check(&request(CMD_READ, 0, (1 << 20) - 512, 1024), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_WRITE, 0, (1 << 20) - 512, 1024), &l), Err(Refusal(ENOSPC)));
        assert_eq!(check(&request(CMD_WRITE_ZEROES, 0, 1 << 20, 512), &l), Err(Refusal(ENOSPC)));
        assert_eq!(check(&request(CMD_TRIM, 0, 1 << 20, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_READ, 0, u64::MAX - 10, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_READ, 0, 100, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_WRITE, 0, 0, 100), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(99, 0, 0, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(
            check(&request(CMD_READ, CMD_FLAG_DF | 1 << 9, 0, 512), &l),
            Err(Refusal(EINVAL))
        );
        assert_eq!(check(&request(CMD_WRITE, 1 << 9, 0, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_FLUSH, 0, 0, 0), &l), Ok(()));
        assert_eq!(check(&request(CMD_FLUSH, 0, 512, 0), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(5, 0, 0, 512), &l), Err(Refusal(EINVAL)), "CACHE not offered");
        let simple = Limits { structured: false, meta_context: false, ..l };
        assert_eq!(check(&request(CMD_READ, CMD_FLAG_DF, 0, 512), &simple), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_BLOCK_STATUS, 0, 0, 512), &simple), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 1, 7), &l), Ok(()));
        let big = PAYLOAD_BYTES_MAX + 512;
        let huge = Limits { size_bytes: u64::MAX, ..l };
        assert_eq!(check(&request(CMD_READ, 0, 0, big), &huge), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_TRIM, 0, 0, big), &huge), Ok(()), "trim is not a payload");
    }

    /// With SEND_FUA advertised, FUA is accepted on every command a client may send (older
    /// qemu sends FLUSH with FUA; it was refused with EINVAL), alone or beside the command's
    /// own flags; it still does not make an unknown command or flag acceptable.
    #[test]
    fn fua_is_accepted_on_every_command() {
        let l = limits();
        let fua = CMD_FLAG_FUA;
        assert_eq!(check(&request(CMD_READ, fua, 0, 512), &l), Ok(()));
        assert_eq!(check(&request(CMD_READ, fua | CMD_FLAG_DF, 0, 512), &l), Ok(()));
        assert_eq!(check(&request(CMD_WRITE, fua, 0, 512), &l), Ok(()));
        assert_eq!(check(&request(CMD_FLUSH, fua, 0, 0), &l), Ok(()));
        assert_eq!(check(&request(CMD_TRIM, fua, 0, 512), &l), Ok(()));
        let zero_flags = fua | CMD_FLAG_NO_HOLE;
        assert_eq!(check(&request(CMD_WRITE_ZEROES, zero_flags, 0, 512), &l), Ok(()));
        assert_eq!(check(&request(CMD_WRITE_ZEROES, fua | CMD_FLAG_FAST_ZERO, 0, 512), &l), Ok(()));
        assert_eq!(check(&request(CMD_BLOCK_STATUS, fua | CMD_FLAG_REQ_ONE, 0, 512), &l), Ok(()));
        let simple = Limits { structured: false, meta_context: false, ..l };
        assert_eq!(check(&request(CMD_READ, fua, 0, 512), &simple), Ok(()));
        assert_eq!(check(&request(CMD_FLUSH, fua, 512, 0), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(99, fua, 0, 512), &l), Err(Refusal(EINVAL)));
        assert_eq!(check(&request(CMD_READ, fua | 1 << 9, 0, 512), &l), Err(Refusal(EINVAL)));
        let no_context = Limits { meta_context: false, ..l };
        assert_eq!(
            check(&request(CMD_BLOCK_STATUS, fua, 0, 512), &no_context),
            Err(Refusal(EINVAL))
        );
    }

    #[test]
    fn option_data_is_bounded() {
        let mut go = Vec::new();
        go.extend_from_slice(&3u32.to_be_bytes());
        go.extend_from_slice(b"vol");
        go.extend_from_slice(&2u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        go.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(parse_go(&go), Some(("vol".into(), vec![INFO_BLOCK_SIZE, INFO_NAME])));
        assert_eq!(parse_go(&go[..go.len() - 1]), None, "truncated");
        let mut long = go.clone();
        long.push(0);
        assert_eq!(parse_go(&long), None, "trailing bytes");
        let mut liar = go.clone();
        liar[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_go(&liar), None, "a length beyond the data");
    }
}
