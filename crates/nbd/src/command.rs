//! One checked request run against its volume, and its reply encoded.
//!
//! [`execute`] runs a request that [`proto::check`] admitted and returns its [`Encoded`]
//! reply; the connection ([`crate::server`]) decides when it goes out. A read's reply is not
//! copied into one buffer: it lists its headers and the ranges of the engine's buffers that
//! hold the data ([`ReadData`]: dirty blocks, cached blocks, the device's read buffers), and
//! [`Encoded::send`] hands them to the socket in vectored writes. Holes go out as hole chunks
//! unless the client asked for one piece (DF). A failed READ or BLOCK_STATUS is answered with
//! an error chunk (with its message) where the client negotiated structured replies; every
//! other failure with a simple reply's errno.

use sluice_engine::{AlignedBuf, ReadData, StoreError, Volume, IOVECS_MAX};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};

use crate::proto::{self, Request};

/// What the handshake settled.
pub(crate) struct Session {
    pub(crate) volume: Volume,
    pub(crate) structured: bool,
    pub(crate) meta_context: bool,
}

/// An encoded reply: its own bytes (headers, or the whole reply when it carries no data), and
/// for a read, the order in which those bytes and the read's data go out. The data stays in
/// the engine's buffers ([`ReadData`]) and goes to the socket with vectored writes.
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    head: Vec<u8>,
    parts: Vec<Part>,
    data: ReadData,
}

#[derive(Debug)]
enum Part {
    /// A range of `head`.
    Head(std::ops::Range<usize>),
    /// A range of the read's data.
    Data(std::ops::Range<usize>),
}

impl From<Vec<u8>> for Encoded {
    fn from(head: Vec<u8>) -> Encoded {
        Encoded { head, ..Encoded::default() }
    }
}

impl Encoded {
    /// Appends `bytes` to the reply's own bytes.
    fn extend(&mut self, bytes: &[u8]) {
        self.start_parts();
        let at = self.head.len();
        self.head.extend_from_slice(bytes);
        match self.parts.last_mut() {
            Some(Part::Head(range)) if range.end == at => range.end = self.head.len(),
            _ => self.parts.push(Part::Head(at..self.head.len())),
        }
    }

    /// Appends `range` of the read's data.
    fn data(&mut self, range: std::ops::Range<usize>) {
        self.start_parts();
        self.parts.push(Part::Data(range));
    }

    /// Bytes put in `head` before any part was added go out first.
    fn start_parts(&mut self) {
        if self.parts.is_empty() && !self.head.is_empty() {
            self.parts.push(Part::Head(0..self.head.len()));
        }
    }

    /// Adds the reply's slices to `out` in the order they go out; returns how many of its
    /// bytes are read data.
    fn slices<'a>(&'a self, out: &mut Vec<std::io::IoSlice<'a>>) -> usize {
        if self.parts.is_empty() {
            if !self.head.is_empty() {
                out.push(std::io::IoSlice::new(&self.head));
            }
            return 0;
        }
        let mut data_bytes = 0;
        for part in &self.parts {
            match part {
                Part::Head(range) => out.push(std::io::IoSlice::new(&self.head[range.clone()])),
                Part::Data(range) => {
                    data_bytes += range.len();
                    self.data
                        .slices(range.start, range.len(), |s| out.push(std::io::IoSlice::new(s)))
                }
            }
        }
        data_bytes
    }

    /// Writes the whole reply ([`send_all`] of one).
    pub(crate) async fn send<W: AsyncWrite + Unpin>(
        &self,
        writer: &mut BufWriter<W>,
    ) -> std::io::Result<()> {
        send_all([self], writer).await
    }
}

/// Writes `replies` whole, in order. Replies without data go into the connection's buffer
/// (the caller flushes it). Where any carries read data and the socket takes vectored writes
/// (not TLS, whose stream writes one slice a call, nor stdio on pipes), all of them go
/// straight to the socket in vectored writes of their headers and the data's slices (at most
/// `IOVECS_MAX` a call, Linux's limit), after whatever the buffer holds: through the buffer, a
/// reply of up to 8 KiB would be copied into it before the kernel copies it again, which was
/// 5.8% of the serving core at 32 queued 4 KiB reads (perf, 2026-11-26). A batch of replies so
/// costs one `writev` and wakes the client once.
pub(crate) async fn send_all<'a, W: AsyncWrite + Unpin>(
    replies: impl IntoIterator<Item = &'a Encoded>,
    writer: &mut BufWriter<W>,
) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'a>> = Vec::with_capacity(4);
    let mut data_bytes = 0;
    for reply in replies {
        data_bytes += reply.slices(&mut slices);
    }
    if data_bytes == 0 || !writer.get_ref().is_write_vectored() {
        return write_slices(writer, &mut slices).await;
    }
    if !writer.buffer().is_empty() {
        // Replies buffered before these go first: replies keep their order.
        writer.flush().await?;
    }
    write_slices(writer.get_mut(), &mut slices).await
}

/// Writes all of `slices`, `IOVECS_MAX` at most a call.
async fn write_slices<W: AsyncWrite + Unpin>(
    writer: &mut W,
    slices: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    let mut left = slices;
    std::io::IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        let batch = left.len().min(IOVECS_MAX);
        let n = writer.write_vectored(&left[..batch]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

/// The reply to a request that failed with `error`.
pub(crate) fn error_reply(
    session: &Session,
    request: &Request,
    error: u32,
    message: &str,
) -> Vec<u8> {
    let structured_only = matches!(request.kind, proto::CMD_READ | proto::CMD_BLOCK_STATUS);
    if session.structured && structured_only {
        proto::error_chunk(request.cookie, error, message)
    } else {
        proto::simple_reply(request.cookie, error).to_vec()
    }
}

fn errno(error: &StoreError) -> u32 {
    use sluice_engine::ErrorKind;
    match error.kind() {
        ErrorKind::Invalid => proto::EINVAL,
        ErrorKind::NoSpace => proto::ENOSPC,
        ErrorKind::Suspended => proto::ESHUTDOWN,
        ErrorKind::ReadOnly => proto::EPERM,
        _ => proto::EIO,
    }
}

/// A write's payload as the connection received it.
#[derive(Debug)]
pub(crate) enum Payload {
    /// In one buffer (none for the other commands).
    Bytes(Vec<u8>),
    /// Whole blocks of the volume, a buffer each ([`Volume::whole_blocks`]).
    Blocks(Blocks),
}

/// A write's whole blocks as the connection received them: the first `ahead` bytes already
/// written as they arrived ([`Volume::write_blocks_ahead`]), then `rest`, the buffers of the
/// blocks after them; or how a part written ahead failed, the rest then dropped.
#[derive(Debug)]
pub(crate) struct Blocks {
    pub ahead: u64,
    pub rest: Vec<AlignedBuf>,
    pub failed: Option<AheadFailed>,
}

/// How a part of a write, written as its payload arrived, failed.
#[derive(Debug)]
pub(crate) enum AheadFailed {
    /// The volume refused it: the write is answered with this error.
    Store(StoreError),
    /// A bug panicked in it: the write is answered EIO, as any request that panics is
    /// (`server.rs`), rather than ending the connection with no answer.
    Panicked,
}

/// Runs one checked request and encodes its reply.
pub(crate) async fn execute(session: &Session, request: &Request, payload: Payload) -> Encoded {
    let volume = &session.volume;
    // FUA may come with any command (`proto::check`). It matters where a request changes the
    // volume (WRITE, TRIM, WRITE_ZEROES: durable before the reply); a FLUSH is durable anyway,
    // and READ and BLOCK_STATUS change nothing to make durable.
    let fua = request.flags & proto::CMD_FLAG_FUA != 0;
    let (offset, len) = (request.offset, u64::from(request.len));
    let done = |result: Result<(), StoreError>| match result {
        Ok(()) => proto::simple_reply(request.cookie, 0).to_vec(),
        Err(e) => error_reply(session, request, errno(&e), &e.to_string()),
    };
    let reply = match request.kind {
        proto::CMD_READ => return read(session, request).await,
        proto::CMD_WRITE if len == 0 => done(Ok(())),
        proto::CMD_WRITE => done(match payload {
            Payload::Bytes(data) => volume.write_owned(offset, data, fua).await,
            Payload::Blocks(Blocks { failed: Some(AheadFailed::Store(error)), .. }) => Err(error),
            Payload::Blocks(Blocks { failed: Some(AheadFailed::Panicked), .. }) => {
                return error_reply(session, request, proto::EIO, "internal error").into();
            }
            Payload::Blocks(Blocks { ahead, rest, failed: None }) => {
                volume.write_blocks(offset + ahead, rest, fua).await
            }
        }),
        proto::CMD_FLUSH => done(volume.flush().await),
        proto::CMD_TRIM if len == 0 => done(Ok(())),
        proto::CMD_TRIM => done(volume.zero(offset, len, fua).await),
        proto::CMD_WRITE_ZEROES if len == 0 => done(Ok(())),
        proto::CMD_WRITE_ZEROES => {
            if request.flags & proto::CMD_FLAG_NO_HOLE == 0 {
                // Zeroing makes holes: metadata only, as fast as zeroing gets.
                done(volume.zero(offset, len, fua).await)
            } else if request.flags & proto::CMD_FLAG_FAST_ZERO != 0 {
                // Allocated zeros are written like data: no faster than a write.
                proto::simple_reply(request.cookie, proto::ENOTSUP).to_vec()
            } else {
                done(write_zeros(volume, offset, len, fua).await)
            }
        }
        proto::CMD_BLOCK_STATUS => block_status(session, request).await,
        // `check` admits nothing else.
        _ => error_reply(session, request, proto::EINVAL, "unknown command"),
    };
    reply.into()
}

/// Writes allocated zeros (WRITE_ZEROES with NO_HOLE), a MiB at a time.
async fn write_zeros(volume: &Volume, offset: u64, len: u64, fua: bool) -> Result<(), StoreError> {
    const PIECE: u64 = 1 << 20;
    let zeros = vec![0u8; PIECE.min(len) as usize];
    let mut at = offset;
    while at < offset + len {
        let n = PIECE.min(offset + len - at);
        volume.write(at, &zeros[..n as usize], false).await?;
        at += n;
    }
    if fua {
        volume.flush().await?;
    }
    Ok(())
}

async fn read(session: &Session, request: &Request) -> Encoded {
    let volume = &session.volume;
    let (offset, len) = (request.offset, u64::from(request.len));
    if !session.structured && len == 0 {
        return proto::simple_reply(request.cookie, 0).to_vec().into();
    }
    if !session.structured {
        return match volume.read_with_status(offset, len).await {
            Ok((data, _)) => {
                let mut out = Encoded::from(proto::simple_reply(request.cookie, 0).to_vec());
                out.data(0..data.len());
                out.data = data;
                out
            }
            Err(e) => proto::simple_reply(request.cookie, errno(&e)).to_vec().into(),
        };
    }
    if len == 0 {
        let done = proto::REPLY_FLAG_DONE;
        return proto::chunk_header(request.cookie, done, proto::REPLY_TYPE_NONE, 0)
            .to_vec()
            .into();
    }
    // Holes go out as hole chunks unless the client asked for one piece (DF). One read of the
    // whole range gives both the data and the map, from the same snapshot.
    let (data, runs) = match volume.read_with_status(offset, len).await {
        Ok(read) => read,
        Err(e) => return error_reply(session, request, errno(&e), &e.to_string()).into(),
    };
    let runs = if request.flags & proto::CMD_FLAG_DF != 0 { vec![(len, true)] } else { runs };
    let mut out = Encoded { head: Vec::with_capacity(runs.len() * 32), ..Encoded::default() };
    let mut at = offset;
    for (i, &(run, allocated)) in runs.iter().enumerate() {
        let flags = if i + 1 == runs.len() { proto::REPLY_FLAG_DONE } else { 0 };
        if allocated {
            out.extend(&proto::chunk_header(
                request.cookie,
                flags,
                proto::REPLY_TYPE_OFFSET_DATA,
                8 + run as u32,
            ));
            out.extend(&at.to_be_bytes());
            let from = (at - offset) as usize;
            out.data(from..from + run as usize);
        } else {
            out.extend(&proto::chunk_header(
                request.cookie,
                flags,
                proto::REPLY_TYPE_OFFSET_HOLE,
                12,
            ));
            out.extend(&at.to_be_bytes());
            out.extend(&(run as u32).to_be_bytes());
        }
        at += run;
    }
    out.data = data;
    out
}

/// Largest range one BLOCK_STATUS answers; the client asks again for the rest.
const BLOCK_STATUS_BYTES_MAX: u64 = 1 << 30;

async fn block_status(session: &Session, request: &Request) -> Vec<u8> {
    let volume = &session.volume;
    let size = volume.size_bytes().unwrap_or(0);
    // Whole sectors that cover the request, within the volume.
    let start = request.offset / 512 * 512;
    let end = (request.offset + u64::from(request.len)).div_ceil(512) * 512;
    let end = end.min(size).min(start + BLOCK_STATUS_BYTES_MAX);
    if end <= start {
        return error_reply(session, request, proto::EINVAL, "range outside the volume");
    }
    let runs = match volume.block_status(start, end - start).await {
        Ok(runs) => runs,
        Err(e) => return error_reply(session, request, errno(&e), &e.to_string()),
    };
    let one = request.flags & proto::CMD_FLAG_REQ_ONE != 0;
    let mut descriptors = Vec::new();
    // The first descriptor starts at the requested offset, not the sector before it.
    let mut skip = request.offset - start;
    for (run, allocated) in runs {
        let run = run - skip.min(run);
        skip = 0;
        if run == 0 {
            continue;
        }
        let flags = if allocated { 0 } else { proto::STATE_HOLE | proto::STATE_ZERO };
        descriptors.extend_from_slice(&(run.min(u64::from(u32::MAX)) as u32).to_be_bytes());
        descriptors.extend_from_slice(&flags.to_be_bytes());
        if one {
            break;
        }
    }
    let mut out = proto::chunk_header(
        request.cookie,
        proto::REPLY_FLAG_DONE,
        proto::REPLY_TYPE_BLOCK_STATUS,
        4 + descriptors.len() as u32,
    )
    .to_vec();
    out.extend_from_slice(&proto::META_BASE_ALLOCATION_ID.to_be_bytes());
    out.extend_from_slice(&descriptors);
    out
}
