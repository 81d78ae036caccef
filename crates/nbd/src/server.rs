//! One NBD connection: the fixed-newstyle handshake, then transmission.
//!
//! Transmission reads requests in order and runs each as its own task, so replies go out as
//! requests complete, not as they arrived (a FUA write waits only for its own log block). A
//! finished request alone on its connection sends its reply itself when the socket is free (a
//! client at queue depth 1: every reply going through a writer task cost a task wake-up per
//! request, 7-10% of the server's CPU per sync write, docs/bench/peers-notes.md). With others in
//! flight it queues its reply for the writer task, which runs after the requests finished on the
//! same turn and sends their replies in one vectored write: a client's queued reads that
//! complete together then cost one `writev` and wake the client once, where a `writev` each
//! kept the serving core writing replies, one by one, while the client's next requests waited
//! unread and the device idled.
//! A write's payload is read in full before its task starts: a client that disconnects in the
//! middle of one leaves no partial write. What a connection may hold in flight is bounded
//! (requests, and the bytes of write payloads and read replies), so a client cannot make the
//! server allocate without limit. Running a request and encoding its reply is
//! `command`'s (command.rs).
//!
//! Bad input never panics and never reaches the engine: a request is checked
//! ([`proto::check`]) against what was negotiated before anything runs, bad magic closes the
//! connection, and an oversized write payload is drained and refused (or, beyond
//! [`proto::PAYLOAD_DRAIN_MAX`], the connection is closed without reading it).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use sluice_engine::{AlignedBuf, UninitBuf, Volume};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
    ReadBuf, ReadHalf, WriteHalf,
};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::command::{
    error_reply, execute, send_all, AheadFailed, Blocks, Encoded, Payload, Session,
};
use crate::placement::{Fixed, Movable, Placed};
use crate::proto::{self, Limits, Request};
use crate::tls::{HandshakeError, Peer, TlsServer};

/// What a server offers: the volumes it serves by name.
pub trait Exports: Send + Sync + 'static {
    /// Names for OPT_LIST, in order.
    fn names(&self) -> Vec<String>;
    /// The volume a client asked for; "" names the default export.
    fn open(&self, name: &str) -> Option<Volume>;
}

/// Why a connection ended other than by the client's choice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    #[error("connection I/O: {0}")]
    Io(std::io::Error),
    #[error("client broke the protocol: {0}")]
    Protocol(String),
    #[error(transparent)]
    Tls(#[from] HandshakeError),
    #[error("refused: {0}")]
    Refused(String),
}

// Not `#[from]`: that would make the inner error this one's `source()` as well as part of its
// message, and a chain would print it twice.
impl From<std::io::Error> for ConnectionError {
    fn from(error: std::io::Error) -> Self {
        ConnectionError::Io(error)
    }
}

/// Bytes one receive may take from a connection's socket.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Requests one connection may have in flight.
const IN_FLIGHT_MAX: usize = 256;
/// How often an idle connection to an encrypted volume looks whether its key was unloaded.
const KEY_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// Payload bytes one connection may hold in flight, in KiB (permits of the byte semaphore).
const IN_FLIGHT_KIB: u32 = 256 << 10;

/// How one round of option haggling ended.
enum Negotiated {
    /// The client chose an export: transmission follows.
    Session(Session),
    /// The client asked for TLS and was told yes: the handshake follows, then haggling again.
    StartTls,
    /// The client ended it (ABORT, or an EXPORT_NAME that cannot be served).
    Ended,
}

/// What haggling needs to know about the connection.
struct Link<'a> {
    /// The server's TLS, if it offers any.
    tls: Option<&'a TlsServer>,
    /// Who the client proved to be, once TLS is up; `None` in plain text.
    peer: Option<Peer>,
    /// The client asked for no zero padding after EXPORT_NAME's reply.
    no_zeroes: bool,
}

impl Link<'_> {
    /// TLS is required and not up yet: every option but STARTTLS and ABORT is refused.
    fn tls_required(&self) -> bool {
        self.peer.is_none() && self.tls.is_some_and(TlsServer::required)
    }

    /// Whether this client may open `export` (the allow-list; see [`TlsServer::admits`]).
    fn admits(&self, export: &str) -> Result<(), String> {
        match (self.tls, &self.peer) {
            (Some(tls), Some(peer)) => tls.admits(export, peer),
            // A plain-text client: an allow-list exists only with TLS required, and then no
            // option gets this far without TLS.
            _ => Ok(()),
        }
    }

    /// [`Link::admits`] for the volume a client asked for by `requested`, checked under both
    /// names: a snapshot handle opened before a rename may still carry the volume's old name.
    fn admits_volume(&self, requested: &str, volume: &Volume) -> Result<(), String> {
        self.admits(&volume.name())?;
        if requested.is_empty() {
            return Ok(());
        }
        self.admits(requested)
    }
}

/// Serves one connection until the client leaves, breaks the protocol, or `shutdown` turns
/// true (then requests already read finish and are answered first). No TLS: a client's
/// STARTTLS is refused.
pub async fn serve_connection<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    serve_connection_tls(stream, exports, shutdown, None).await
}

/// [`serve_connection`] with TLS as `tls` says: offered or required, with its credentials.
///
/// After STARTTLS the same haggling and transmission code runs again over the TLS stream
/// (generic over the stream, so the plain path has no indirection per request). Nothing
/// settled before TLS carries over: options a man in the middle could have sent in plain
/// text (structured replies, meta contexts) must be asked for again inside TLS.
pub async fn serve_connection_tls<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    shutdown: watch::Receiver<bool>,
    tls: Option<Arc<TlsServer>>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    serve_placed(Fixed(stream), exports, shutdown, tls, None).await
}

/// [`serve_connection_tls`] for a connection accepted onto a serving core: once the client has
/// chosen its export, the connection moves to that volume's home core if `placed` has one
/// (placement.rs).
pub(crate) async fn serve_placed<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    shutdown: watch::Receiver<bool>,
    tls: Option<Arc<TlsServer>>,
    placed: Option<Placed>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Movable + Send + Unpin + 'static,
{
    let direct = stream.socket_fd();
    let (reader, writer) = tokio::io::split(stream);
    // A request's header and its payload usually arrive together: one receive takes both
    // (and any requests behind them) instead of one call each.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut writer = BufWriter::new(writer);
    // Haggling, TLS handshake included, has a deadline and ends at shutdown: a client that
    // never finishes it would otherwise hold its connection, and a clean stop, for ever.
    let deadline = tokio::time::Instant::now() + HAGGLING_LIMIT;
    let mut stop = shutdown.clone();
    let Some(no_zeroes) = haggling(greet(&mut reader, &mut writer), deadline, &mut stop).await?
    else {
        return Ok(());
    };
    let plain = Link { tls: tls.as_deref(), peer: None, no_zeroes };
    let negotiated = negotiate(&mut reader, &mut writer, exports.as_ref(), &plain);
    match haggling(negotiated, deadline, &mut stop).await? {
        Some(Negotiated::Session(session)) => {
            return serve_at_home(reader, writer, session, shutdown, placed, direct).await
        }
        Some(Negotiated::Ended) | None => return Ok(()),
        Some(Negotiated::StartTls) => {}
    }
    // `negotiate` acknowledges STARTTLS only when the server has TLS.
    let Some(tls) = tls else { return Err(protocol("STARTTLS without TLS configured")) };
    // The client must wait for the reply before its handshake: anything read past the option
    // was sent in plain text where TLS was asked for (an injection, or a broken client).
    if !reader.buffer().is_empty() {
        return Err(protocol("data after NBD_OPT_STARTTLS, before the server's reply"));
    }
    let stream = reader.into_inner().unsplit(writer.into_inner());
    let accepted = async { tls.accept(stream).await.map_err(ConnectionError::from) };
    let Some((stream, peer)) = haggling(accepted, deadline, &mut stop).await? else {
        return Ok(());
    };
    let (reader, writer) = tokio::io::split(stream);
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut writer = BufWriter::new(writer);
    // The greeting is not sent again: haggling goes on inside TLS.
    let secured = Link { tls: Some(&tls), peer: Some(peer), no_zeroes };
    let negotiated = negotiate(&mut reader, &mut writer, exports.as_ref(), &secured);
    match haggling(negotiated, deadline, &mut stop).await? {
        Some(Negotiated::Session(session)) => {
            // Decrypted bytes come through the stream, never from the socket itself.
            serve_at_home(reader, writer, session, shutdown, placed, None).await
        }
        Some(Negotiated::Ended) | None => Ok(()),
        Some(Negotiated::StartTls) => Err(protocol("STARTTLS inside TLS")),
    }
}

/// Runs transmission on the home core of the session's volume: here, or after moving the
/// connection there (its socket leaves this core's reactor and joins the home core's).
async fn serve_at_home<T>(
    reader: BufReader<ReadHalf<T>>,
    mut writer: BufWriter<WriteHalf<T>>,
    session: Session,
    shutdown: watch::Receiver<bool>,
    placed: Option<Placed>,
    direct: Option<RawFd>,
) -> Result<(), ConnectionError>
where
    T: AsyncRead + AsyncWrite + Movable + Send + Unpin + 'static,
{
    // A client that sent requests before the export's reply came (none does: it cannot know
    // the export was granted) keeps its connection where it is rather than lose them.
    let placed = placed.filter(|_| reader.buffer().is_empty());
    let (home, core) = match placed.and_then(|placed| placed.home(&session.volume)) {
        Some((home, Some(core))) => (home, core),
        stay => {
            if let Some((home, _)) = &stay {
                home.assert_here();
            }
            let served = transmission(reader, writer, session, shutdown, direct).await;
            drop(stay);
            return served;
        }
    };
    writer.flush().await?;
    let mut stream = reader.into_inner().unsplit(writer.into_inner());
    stream.detach()?;
    let moved = core.spawn(async move {
        home.assert_here();
        stream.attach()?;
        // The same socket (a TLS stream's is `None` still), registered with this core.
        let direct = direct.and(stream.socket_fd());
        let (reader, writer) = tokio::io::split(stream);
        let reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
        let served = transmission(reader, BufWriter::new(writer), session, shutdown, direct).await;
        drop(home);
        served
    });
    match moved.await {
        Ok(served) => served,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The home core stopped (the server is shutting down) and dropped the connection.
        Err(_) => Ok(()),
    }
}

/// How long a client has from connecting to choosing an export (qemu-nbd's default
/// `--handshake-limit`): greeting, options and any TLS handshake.
const HAGGLING_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a step of haggling until `deadline`; `None` if the server is stopping.
async fn haggling<T>(
    step: impl std::future::Future<Output = Result<T, ConnectionError>>,
    deadline: tokio::time::Instant,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<T>, ConnectionError> {
    tokio::select! {
        done = tokio::time::timeout_at(deadline, step) => match done {
            Ok(result) => result.map(Some),
            Err(_) => Err(protocol(format!(
                "option haggling took longer than {} s: the connection is closed",
                HAGGLING_LIMIT.as_secs()
            ))),
        },
        _ = stop.wait_for(|stop| *stop) => Ok(None),
    }
}

async fn send<W: AsyncWrite + Unpin>(writer: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    writer.write_all(bytes).await?;
    writer.flush().await
}

/// Reads and drops `len` bytes without holding them.
async fn drain<R: AsyncRead + Unpin>(reader: &mut R, mut len: u64) -> std::io::Result<()> {
    let mut sink = [0u8; 8192];
    while len > 0 {
        let n = (len as usize).min(sink.len());
        reader.read_exact(&mut sink[..n]).await?;
        len -= n as u64;
    }
    Ok(())
}

fn protocol(message: impl Into<String>) -> ConnectionError {
    ConnectionError::Protocol(message.into())
}

/// The server's greeting and the client's flags; returns whether the client wants no zero
/// padding after EXPORT_NAME's reply.
async fn greet<R, W>(reader: &mut R, writer: &mut W) -> Result<bool, ConnectionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&proto::INIT_MAGIC.to_be_bytes());
    hello.extend_from_slice(&proto::OPTS_MAGIC.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    send(writer, &hello).await?;
    let client_flags = reader.read_u32().await?;
    if client_flags & !(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES) != 0 {
        return Err(protocol(format!("unknown client flags {client_flags:#x}")));
    }
    Ok(client_flags & proto::CLIENT_NO_ZEROES != 0)
}

/// Option haggling, until the client chooses an export, asks for TLS, or ends it.
async fn negotiate<R, W>(
    reader: &mut R,
    writer: &mut W,
    exports: &dyn Exports,
    link: &Link<'_>,
) -> Result<Negotiated, ConnectionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut structured = false;
    let mut meta_context = false;
    for _ in 0..proto::OPTIONS_MAX {
        let magic = reader.read_u64().await?;
        if magic != proto::OPTS_MAGIC {
            return Err(protocol(format!("option magic {magic:#x}")));
        }
        let option = reader.read_u32().await?;
        let len = reader.read_u32().await?;
        // With TLS required, only STARTTLS and ABORT are answered in plain text (the spec's
        // FORCEDTLS mode). EXPORT_NAME has no error reply, so it ends the connection.
        let gated = link.tls_required()
            && !matches!(option, proto::OPT_STARTTLS | proto::OPT_ABORT | proto::OPT_EXPORT_NAME);
        if len > proto::OPTION_BYTES_MAX {
            if len > proto::OPTION_BYTES_DRAIN_MAX {
                return Err(protocol(format!("option {option} with {len} bytes of data")));
            }
            drain(reader, u64::from(len)).await?;
            let message = format!("option data over {} bytes", proto::OPTION_BYTES_MAX);
            let error = if gated { tls_required(option) } else { too_big(option, &message) };
            send(writer, &error).await?;
            continue;
        }
        // Bounded by OPTION_BYTES_MAX above.
        let mut data = vec![0u8; len as usize];
        reader.read_exact(&mut data).await?;
        if gated {
            send(writer, &tls_required(option)).await?;
            continue;
        }
        let reply = |kind, data: &[u8]| proto::option_reply(option, kind, data);
        match option {
            proto::OPT_EXPORT_NAME => {
                if link.tls_required() {
                    return Err(ConnectionError::Refused(String::from(
                        "NBD_OPT_EXPORT_NAME before STARTTLS, with TLS required",
                    )));
                }
                let requested = std::str::from_utf8(&data).unwrap_or_default();
                let volume = std::str::from_utf8(&data).ok().and_then(|name| exports.open(name));
                // No error reply exists for this option: an unknown export ends the connection.
                let Some(volume) = volume else { return Ok(Negotiated::Ended) };
                if let Err(why) = link.admits_volume(requested, &volume) {
                    return Err(ConnectionError::Refused(why));
                }
                let Some(size) = volume.size_bytes() else { return Ok(Negotiated::Ended) };
                let mut out = Vec::with_capacity(134);
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(
                    &transmission_flags(structured, volume.is_read_only()).to_be_bytes(),
                );
                if !link.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                send(writer, &out).await?;
                return Ok(Negotiated::Session(Session { volume, structured, meta_context }));
            }
            proto::OPT_ABORT => {
                // The client may already have closed; its loss.
                let _ = send(writer, &reply(proto::REP_ACK, &[])).await;
                return Ok(Negotiated::Ended);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    send(
                        writer,
                        &proto::option_error(option, proto::REP_ERR_INVALID, "LIST takes no data"),
                    )
                    .await?;
                    continue;
                }
                let mut out = Vec::new();
                // Exports this client may not open are left out.
                for name in exports.names().into_iter().filter(|n| link.admits(n).is_ok()) {
                    let mut entry = (name.len() as u32).to_be_bytes().to_vec();
                    entry.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(&reply(proto::REP_SERVER, &entry));
                }
                out.extend_from_slice(&reply(proto::REP_ACK, &[]));
                send(writer, &out).await?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let Some((name, requests)) = proto::parse_go(&data) else {
                    send(
                        writer,
                        &proto::option_error(
                            option,
                            proto::REP_ERR_INVALID,
                            "malformed INFO/GO data",
                        ),
                    )
                    .await?;
                    continue;
                };
                let found =
                    exports.open(&name).and_then(|v| Some((v.size_bytes()?, v.block_bytes()?, v)));
                let Some((size, block, volume)) = found else {
                    let message = format!("no export named {name:?}; OPT_LIST shows them");
                    send(writer, &proto::option_error(option, proto::REP_ERR_UNKNOWN, &message))
                        .await?;
                    continue;
                };
                if let Err(why) = link.admits_volume(&name, &volume) {
                    send(writer, &proto::option_error(option, proto::REP_ERR_POLICY, &why)).await?;
                    continue;
                }
                let mut out = Vec::new();
                let mut sizes = proto::INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                sizes.extend_from_slice(&proto::BLOCK_BYTES_MIN.to_be_bytes());
                sizes.extend_from_slice(&block.max(proto::BLOCK_BYTES_MIN).to_be_bytes());
                sizes.extend_from_slice(&proto::PAYLOAD_BYTES_MAX.to_be_bytes());
                out.extend_from_slice(&reply(proto::REP_INFO, &sizes));
                if requests.contains(&proto::INFO_NAME) {
                    let mut info = proto::INFO_NAME.to_be_bytes().to_vec();
                    info.extend_from_slice(volume.name().as_bytes());
                    out.extend_from_slice(&reply(proto::REP_INFO, &info));
                }
                if requests.contains(&proto::INFO_DESCRIPTION) {
                    let mut info = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
                    info.extend_from_slice(format!("sluice volume {}", volume.name()).as_bytes());
                    out.extend_from_slice(&reply(proto::REP_INFO, &info));
                }
                let mut export = proto::INFO_EXPORT.to_be_bytes().to_vec();
                export.extend_from_slice(&size.to_be_bytes());
                export.extend_from_slice(
                    &transmission_flags(structured, volume.is_read_only()).to_be_bytes(),
                );
                out.extend_from_slice(&reply(proto::REP_INFO, &export));
                out.extend_from_slice(&reply(proto::REP_ACK, &[]));
                send(writer, &out).await?;
                if option == proto::OPT_GO {
                    return Ok(Negotiated::Session(Session { volume, structured, meta_context }));
                }
            }
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() || structured {
                    send(
                        writer,
                        &proto::option_error(
                            option,
                            proto::REP_ERR_INVALID,
                            "structured replies take no data and are set once",
                        ),
                    )
                    .await?;
                    continue;
                }
                structured = true;
                send(writer, &reply(proto::REP_ACK, &[])).await?;
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                let set = option == proto::OPT_SET_META_CONTEXT;
                if set && !structured {
                    send(
                        writer,
                        &proto::option_error(
                            option,
                            proto::REP_ERR_INVALID,
                            "negotiate structured replies first",
                        ),
                    )
                    .await?;
                    continue;
                }
                let Some((name, queries)) = proto::parse_meta_context(&data) else {
                    send(
                        writer,
                        &proto::option_error(
                            option,
                            proto::REP_ERR_INVALID,
                            "malformed meta context data",
                        ),
                    )
                    .await?;
                    continue;
                };
                let Some(volume) = exports.open(&name) else {
                    let message = format!("no export named {name:?}");
                    send(writer, &proto::option_error(option, proto::REP_ERR_UNKNOWN, &message))
                        .await?;
                    continue;
                };
                if let Err(why) = link.admits_volume(&name, &volume) {
                    send(writer, &proto::option_error(option, proto::REP_ERR_POLICY, &why)).await?;
                    continue;
                }
                // Only base:allocation exists. LIST with no query, or the "base:" namespace,
                // lists it; unknown contexts are simply not returned.
                let wanted = queries
                    .iter()
                    .any(|q| q == proto::META_BASE_ALLOCATION || (!set && q == "base:"))
                    || (!set && queries.is_empty());
                let mut out = Vec::new();
                if wanted {
                    let mut context = proto::META_BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    context.extend_from_slice(proto::META_BASE_ALLOCATION.as_bytes());
                    out.extend_from_slice(&reply(proto::REP_META_CONTEXT, &context));
                }
                if set {
                    meta_context = wanted;
                }
                out.extend_from_slice(&reply(proto::REP_ACK, &[]));
                send(writer, &out).await?;
            }
            proto::OPT_STARTTLS => {
                let refusal = match (link.tls, &link.peer) {
                    (None, _) => Some((
                        proto::REP_ERR_POLICY,
                        "TLS is not offered (sluice serve --tls off); connect over a Unix \
                         socket or a trusted network, or restart the server with --tls",
                    )),
                    (Some(_), Some(_)) => Some((proto::REP_ERR_INVALID, "TLS is already on")),
                    (Some(_), None) if !data.is_empty() => {
                        Some((proto::REP_ERR_INVALID, "STARTTLS takes no data"))
                    }
                    (Some(_), None) => None,
                };
                if let Some((error, message)) = refusal {
                    send(writer, &proto::option_error(option, error, message)).await?;
                    continue;
                }
                send(writer, &reply(proto::REP_ACK, &[])).await?;
                return Ok(Negotiated::StartTls);
            }
            _ => {
                send(writer, &proto::option_error(option, proto::REP_ERR_UNSUP, "unknown option"))
                    .await?;
            }
        }
    }
    Err(protocol(format!("more than {} options", proto::OPTIONS_MAX)))
}

/// The reply to an option sent in plain text when TLS is required.
fn tls_required(option: u32) -> Vec<u8> {
    let message = "TLS is required: send NBD_OPT_STARTTLS first (for example an nbds:// URI)";
    proto::option_error(option, proto::REP_ERR_TLS_REQD, message)
}

fn too_big(option: u32, message: &str) -> Vec<u8> {
    proto::option_error(option, proto::REP_ERR_TOO_BIG, message)
}

/// The flags a volume's export advertises: flush, FUA, trim, write-zeroes with fast zero, and
/// multi-connection (a flush covers every connection: the log is per volume). A snapshot's
/// export is read-only: it says so and offers nothing that writes (a client that writes
/// anyway gets EPERM).
fn transmission_flags(structured: bool, read_only: bool) -> u16 {
    let mut flags = proto::FLAG_HAS_FLAGS | proto::FLAG_SEND_FLUSH | proto::FLAG_CAN_MULTI_CONN;
    if read_only {
        flags |= proto::FLAG_READ_ONLY;
    } else {
        flags |= proto::FLAG_SEND_FUA
            | proto::FLAG_SEND_TRIM
            | proto::FLAG_SEND_WRITE_ZEROES
            | proto::FLAG_SEND_FAST_ZERO;
    }
    if structured {
        flags |= proto::FLAG_SEND_DF;
    }
    flags
}

/// A reply ready to send, with the request's in-flight budget released when it is dropped.
struct Reply {
    bytes: Encoded,
    _slot: tokio::sync::OwnedSemaphorePermit,
    _budget: Option<tokio::sync::OwnedSemaphorePermit>,
}

async fn transmission<R, W>(
    mut reader: BufReader<R>,
    writer: BufWriter<W>,
    session: Session,
    mut shutdown: watch::Receiver<bool>,
    direct: Option<RawFd>,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // A request alone on its connection sends its own reply when nobody else is sending (no
    // other task woken). With others in flight it queues the reply for the sender task, which
    // a serving core's scheduler runs after the tasks already due on this turn: requests whose
    // device reads completed together queue their replies first, and the sender writes them
    // all in one vectored write (more only where `IOVECS_MAX` or the socket's room splits
    // it), waking the client once.
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let (replies, mut outbox) = mpsc::unbounded_channel::<Reply>();
    let out = Arc::clone(&writer);
    let sender = tokio::spawn(async move {
        let mut batch = Vec::new();
        while outbox.recv_many(&mut batch, IN_FLIGHT_MAX).await > 0 {
            let mut writer = out.lock().await;
            // Replies queued while the socket was busy go in the same write.
            while batch.len() < IN_FLIGHT_MAX {
                let Ok(reply) = outbox.try_recv() else { break };
                batch.push(reply);
            }
            send_all(batch.iter().map(|reply| &reply.bytes), &mut *writer).await?;
            writer.flush().await?;
            // Sent: their in-flight budget is released.
            batch.clear();
        }
        let mut writer = out.lock().await;
        writer.flush().await?;
        writer.shutdown().await
    });
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let budget = Arc::new(Semaphore::new(IN_FLIGHT_KIB as usize));
    let session = Arc::new(session);
    let mut header = [0u8; proto::REQUEST_BYTES];
    let result = loop {
        if replies.is_closed() {
            // The sender's write failed (the client is gone): nothing read from here on could
            // be answered. Its error is the connection's, below.
            break Ok(());
        }
        // An encrypted volume's connection, idle, is closed within KEY_CHECK of its key being
        // unloaded (`key unload -f`); the read of the next header is cancelled only then,
        // when nothing more is read from the connection anyway.
        let encrypted = session.volume.is_encrypted();
        let read = {
            let next = reader.read_exact(&mut header);
            tokio::pin!(next);
            loop {
                tokio::select! {
                    read = &mut next => break Some(read),
                    _ = shutdown.wait_for(|stop| *stop) => break None,
                    _ = tokio::time::sleep(KEY_CHECK), if encrypted => {
                        if session.volume.key_unloaded() {
                            break None;
                        }
                    }
                }
            }
        };
        let Some(read) = read else { break Ok(()) };
        match read {
            Ok(_) => {}
            // The client went away between requests: a normal end.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e.into()),
        }
        let request = match Request::parse(&header) {
            Ok(request) => request,
            Err(proto::BadMagic(magic)) => {
                break Err(protocol(format!("request magic {magic:#x}")))
            }
        };
        if request.kind == proto::CMD_DISC {
            break Ok(());
        }
        let Some(size_bytes) = session.volume.size_bytes() else {
            break Err(protocol(format!("volume {} was destroyed", session.volume.name())));
        };
        if session.volume.key_unloaded() {
            // `key unload -f`: requests in flight have finished or fail; no more are taken.
            break Err(protocol(format!(
                "volume {}: its key was unloaded (`sluice key unload`)",
                session.volume.name()
            )));
        }
        let limits = Limits {
            size_bytes,
            structured: session.structured,
            meta_context: session.meta_context,
        };
        let slot = Arc::clone(&slots).acquire_owned().await.expect("never closed");
        let payload_len = request.payload_len();
        let checked = proto::check(&request, &limits);
        if payload_len > 0 && (checked.is_err() || payload_len > proto::PAYLOAD_BYTES_MAX) {
            // Refused writes still carry their payload: drain it (within reason) to stay in
            // step with the client.
            if payload_len > proto::PAYLOAD_DRAIN_MAX {
                break Err(protocol(format!("write payload of {payload_len} bytes")));
            }
            if let Err(e) = drain(&mut reader, u64::from(payload_len)).await {
                break Err(e.into());
            }
        }
        if let Err(proto::Refusal(error)) = checked {
            let bytes = error_reply(&session, &request, error, "request refused").into();
            let _ = replies.send(Reply { bytes, _slot: slot, _budget: None });
            continue;
        }
        if matches!(request.kind, proto::CMD_READ | proto::CMD_WRITE) {
            // Noted before a write's payload is received, so that its own receive already
            // finds the core's mean large (a core serving large requests sleeps without
            // polling first). Refused requests move no data; trims and zeroes move none.
            sluice_engine::rt::note_request(request.len);
        }
        // A read's reply holds its bytes (the blocks they lie in) until it is sent, as a
        // write holds its payload: both count against the connection's budget.
        let held = if request.kind == proto::CMD_READ { request.len } else { payload_len };
        let kib = held.div_ceil(1024).max(1);
        let budget = Arc::clone(&budget).acquire_many_owned(kib).await.expect("never closed");
        // A write of whole blocks is received into a buffer per block, which become its dirty
        // blocks as they are; any other into one buffer, copied into its blocks.
        // A large one that is the connection's only request has its blocks written as they
        // arrive (`Volume::write_blocks_ahead`).
        let whole_blocks = session.volume.whole_blocks(request.offset, u64::from(payload_len));
        let received = match whole_blocks {
            Some(bs) if payload_len > 0 => {
                let len = payload_len as usize;
                let alone = slots.available_permits() == IN_FLIGHT_MAX - 1;
                let ahead = (alone && len >= AHEAD_PAYLOAD_BYTES_MIN)
                    .then(|| Ahead { volume: &session.volume, offset: request.offset });
                let sums = session.volume.checksums_on_arrival();
                read_blocks(&mut reader, direct, len, bs, sums, ahead).await.map(Payload::Blocks)
            }
            _ if payload_len > 0 => {
                read_payload(&mut reader, payload_len as usize).await.map(Payload::Bytes)
            }
            _ => Ok(Payload::Bytes(Vec::new())),
        };
        let payload = match received {
            Ok(payload) => payload,
            // A write cut off mid-payload is dropped, but for the parts of a large one written
            // ahead (`read_blocks`), which stay written: it was never answered, and its range
            // is the client's to write again.
            Err(e) => break Err(e.into()),
        };
        let (session, replies, writer, slots) =
            (Arc::clone(&session), replies.clone(), Arc::clone(&writer), Arc::clone(&slots));
        let fut = async move {
            // A bug below must not leave the client waiting forever: a panic answers EIO.
            let run = std::panic::AssertUnwindSafe(execute(&session, &request, payload));
            let bytes = match futures::FutureExt::catch_unwind(run).await {
                Ok(bytes) => bytes,
                Err(_) => error_reply(&session, &request, proto::EIO, "internal error").into(),
            };
            let reply = Reply { bytes, _slot: slot, _budget: Some(budget) };
            // This request's own slot is still held, in `reply`.
            let alone = slots.available_permits() == IN_FLIGHT_MAX - 1;
            if alone {
                if let Ok(mut writer) = writer.try_lock() {
                    // A failed send means the client is gone; the reader sees it end.
                    if reply.bytes.send(&mut *writer).await.is_ok() {
                        let _ = writer.flush().await;
                    }
                    return;
                }
            }
            let _ = replies.send(reply);
        };
        // Boxed before it is spawned: the request's future is about 4 KiB (it holds the
        // deepest engine call's state), and tokio moves an unboxed one by value through
        // several frames into its task cell and again as the task's stage changes. Those
        // copies were a tenth of the server's CPU at 32 clients of 4 KiB write + flush (perf,
        // 2026-11-26); boxed, it is copied once and the task moves a pointer.
        tokio::spawn(Box::pin(fut));
    };
    // Every task still running holds a sender; the writer ends when the last one is answered.
    drop(replies);
    let sent = sender.await.map_err(|e| protocol(format!("reply writer: {e}")))?;
    result?;
    sent.map_err(ConnectionError::from)
}

/// Reads a write's payload of `len` bytes into a buffer that is not zeroed first (the read
/// fills its spare capacity; zeroing a 1 MiB payload was 3% of the server's CPU on 1 MiB
/// write + flush, perf 2026-11-25).
async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        // Bounded by the payload, so bytes of the next request stay in the reader.
        let mut rest = (&mut *reader).take((len - data.len()) as u64);
        if rest.read_buf(&mut data).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    debug_assert_eq!(data.len(), len);
    Ok(data)
}

/// Where a write's blocks go as they arrive: the volume, and the write's offset.
struct Ahead<'a> {
    volume: &'a Volume,
    offset: u64,
}

/// Writes of at least this many bytes are written ahead as they arrive when their connection
/// has nothing else in flight ([`read_blocks`]).
const AHEAD_PAYLOAD_BYTES_MIN: usize = 256 << 10;

/// A part written ahead holds at least this many bytes of whole blocks.
const AHEAD_PART_BYTES_MIN: usize = 256 << 10;

/// Reads a write's payload of `len` bytes, whole blocks of `block_bytes`, into a buffer per
/// block, none zeroed first (`Volume::write_blocks`: each becomes its block as it is). What
/// the connection's buffer holds already (the payload's start, received with its header) is
/// copied out of it; the rest is received straight into the blocks. With `direct`, a plain
/// socket's descriptor, one vectored receive takes whatever the socket holds into all the
/// blocks' unfilled bytes. One read per block would cost a receive per 16 KiB where a
/// contiguous buffer took a few per MiB (measured: more context switches per 1 MiB write, its
/// latency up 50%). Without a descriptor (TLS, whose bytes come decrypted through the stream;
/// a pipe), reads go through the stream into the block being filled, over TLS a record's
/// plaintext at most. When nothing is there yet, a read through the stream waits for the
/// next bytes.
///
/// With `ahead`, whenever nothing is there yet while [`AHEAD_PART_BYTES_MIN`] or more of
/// whole blocks wait (a stream, without a descriptor to ask, then polls its read once first
/// to see), those are written before waiting (`Volume::write_blocks_ahead`), so
/// that their log writes can start while the client is still sending: a client's 1 MiB write
/// arrives over a few hundred microseconds in pieces of its socket buffer, about as long as
/// the device takes to write it, and a flush after it waited for both one after the other.
/// So over TLS too, where each record is decrypted on the serving core as it is read. The
/// last block is never written ahead: the request's own write, with the rest, answers it. A
/// part that fails ends the writing ahead; the payload is still read to its end.
///
/// With `sums`, each block's checksum is taken as soon as its last byte is in
/// (`UninitBuf::remember_xxh3`), while the receive's copy has left it in the CPU's cache.
async fn read_blocks<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    direct: Option<RawFd>,
    len: usize,
    block_bytes: usize,
    sums: bool,
    ahead: Option<Ahead<'_>>,
) -> std::io::Result<Blocks> {
    assert!(block_bytes > 0 && len % block_bytes == 0, "a payload of whole blocks");
    // The blocks not handed ahead: `handed` blocks went before them.
    let mut blocks: VecDeque<UninitBuf> =
        (0..len / block_bytes).map(|_| UninitBuf::new(block_bytes)).collect();
    let (mut handed, mut failed) = (0usize, None);
    let buffered = &reader.buffer()[..reader.buffer().len().min(len)];
    for (block, bytes) in blocks.iter_mut().zip(buffered.chunks(block_bytes)) {
        block.write_at(0, bytes);
    }
    let mut filled = buffered.len();
    reader.consume(filled);
    // Blocks (counted from the payload's first) whose checksums were taken.
    let mut summed = 0usize;
    let mut take_sums = |blocks: &mut VecDeque<UninitBuf>, filled: usize, handed: usize| {
        if !sums {
            return;
        }
        // Only whole blocks are handed ahead, and each had its checksum taken first.
        assert!(summed >= handed, "a block handed ahead without its checksum");
        let complete = filled / block_bytes;
        for block in blocks.range_mut(summed - handed..complete - handed) {
            // SAFETY: the block lies wholly before `filled`, every byte of which was written.
            unsafe { block.remember_xxh3() };
        }
        summed = complete;
    };
    while filled < len {
        take_sums(&mut blocks, filled, handed);
        // The connection's buffer is empty, so reading past it keeps the stream's order.
        debug_assert!(reader.buffer().is_empty());
        // Bytes received into the blocks still held.
        let held = filled - handed * block_bytes;
        // The whole blocks held, if they would be written ahead were nothing more there yet:
        // the part, and what is left after it, both logged by pointer (a copied rest would
        // cost log blocks and keep the last part's early commit from being taken).
        let whole = held / block_bytes;
        let part_ahead = ahead.as_ref().filter(|ahead| {
            let (part, left) =
                (whole * block_bytes, len - handed * block_bytes - whole * block_bytes);
            failed.is_none()
                && part >= AHEAD_PART_BYTES_MIN
                && ahead.volume.logs_by_pointer(part as u64)
                && ahead.volume.logs_by_pointer(left as u64)
        });
        // What is there now, taken without waiting: `None` when nothing is yet.
        let ready = match direct {
            Some(fd) => match receive_into(fd, blocks.make_contiguous(), held, block_bytes) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => Some(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => return Err(e),
                Err(_) => None,
            },
            // A stream looks only where a part waits to be written ahead; else it just waits.
            None if part_ahead.is_some() => {
                let (block, at) = (&mut blocks[held / block_bytes], held % block_bytes);
                // One poll: a stream with nothing ready says so, and wakes this task when it
                // has (the wait below, or the next look, takes that).
                match std::future::poll_fn(|cx| Poll::Ready(poll_read_into(reader, block, at, cx)))
                    .await
                {
                    Poll::Ready(n) => Some(n?),
                    Poll::Pending => None,
                }
            }
            None => None,
        };
        if let Some(n) = ready {
            filled += n;
            continue;
        }
        // Nothing there yet: the whole blocks waiting are written ahead, or the read below
        // waits for more.
        if let Some(ahead) = part_ahead {
            // SAFETY: each of these blocks was written whole, in order, by `write_at` or
            // receives, as `filled` counted.
            let part: Vec<AlignedBuf> =
                blocks.drain(..whole).map(|block| unsafe { block.assume_init() }).collect();
            let at = ahead.offset + (handed * block_bytes) as u64;
            handed += whole;
            // A bug below must not end the connection unanswered: the write is answered EIO
            // (`AheadFailed::Panicked`), as `execute`'s are.
            let write = std::panic::AssertUnwindSafe(ahead.volume.write_blocks_ahead(at, part));
            match futures::FutureExt::catch_unwind(write).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => failed = Some(AheadFailed::Store(error)),
                Err(_) => failed = Some(AheadFailed::Panicked),
            }
            // The socket or stream may hold more by now.
            continue;
        }
        let (block, at) = (&mut blocks[held / block_bytes], held % block_bytes);
        filled += std::future::poll_fn(|cx| poll_read_into(reader, block, at, cx)).await?;
    }
    take_sums(&mut blocks, filled, handed);
    // SAFETY: bytes 0..len were all written, in order: the buffered ones by `write_at`, the
    // rest by receives into the blocks' spare bytes from `filled` on, each counted as the
    // kernel or the stream's `ReadBuf` reported them.
    let rest = blocks.into_iter().map(|block| unsafe { block.assume_init() }).collect();
    Ok(Blocks { ahead: (handed * block_bytes) as u64, rest, failed })
}

/// Polls one read through the stream into `block`'s unfilled bytes from `at` on: how many it
/// wrote there (an end of stream is an error: the payload was cut off).
fn poll_read_into<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    block: &mut UninitBuf,
    at: usize,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    let mut view = ReadBuf::uninit(block.spare(at));
    let spare = view.filled().as_ptr();
    if let Err(e) = std::task::ready!(Pin::new(reader.get_mut()).poll_read(cx, &mut view)) {
        return Poll::Ready(Err(e));
    }
    // What counts is what the reader wrote into this view of the block, not elsewhere.
    debug_assert_eq!(view.filled().as_ptr(), spare, "the reader filled the view");
    Poll::Ready(match view.filled().len() {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        n => Ok(n),
    })
}

/// One receive, without waiting, on the socket `fd` into the blocks' bytes from `filled` on
/// (as many of them as one call takes): how many bytes it wrote there.
fn receive_into(
    fd: RawFd,
    blocks: &mut [UninitBuf],
    filled: usize,
    block_bytes: usize,
) -> std::io::Result<usize> {
    let first = filled / block_bytes;
    let mut iovecs: Vec<libc::iovec> = blocks[first..]
        .iter_mut()
        .take(sluice_engine::IOVECS_MAX)
        .map(|block| libc::iovec { iov_base: block.as_mut_ptr().cast(), iov_len: block_bytes })
        .collect();
    let skip = filled % block_bytes;
    // SAFETY: the first block's unfilled bytes start `skip` into it, inside its allocation.
    iovecs[0].iov_base = unsafe { iovecs[0].iov_base.cast::<u8>().add(skip).cast() };
    iovecs[0].iov_len -= skip;
    // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iovecs`.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iovecs.as_mut_ptr();
    message.msg_iovlen = iovecs.len() as _;
    // SAFETY: every iovec covers unfilled bytes of a block this call borrows mutably, which
    // outlive it; the kernel writes at most their lengths. MSG_DONTWAIT: never blocks the
    // serving core, whatever the descriptor's own mode.
    let n = unsafe { libc::recvmsg(fd, &mut message, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    //! One session against a real store on instant simulated disks, as a client sees it.

    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use sluice_engine::Volume;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{
        read_blocks, serve_connection, serve_connection_tls, ConnectionError, Exports,
        READ_BUFFER_BYTES,
    };
    use crate::proto::{self, Request};
    use crate::testing::{
        connect, go, go_data, hello, option, option_replies, psk_handshake, psk_handshake_up_to,
        reply, request, store, tls, Client, OneVolume, KEY,
    };
    use crate::tls::{TlsServer, TlsSettings};

    /// A session served on one end of a socket pair, so replies go out as the vectored
    /// writes they are (an in-memory duplex would take them in any shape); the client's end.
    fn socket_session(
        exports: &Arc<dyn Exports>,
        shutdown: &tokio::sync::watch::Receiver<bool>,
    ) -> (tokio::net::UnixStream, tokio::task::JoinHandle<Result<(), ConnectionError>>) {
        let (client, server) = tokio::net::UnixStream::pair().unwrap();
        let session = serve_connection(server, Arc::clone(exports), shutdown.clone());
        (client, tokio::spawn(session))
    }

    /// With SEND_FUA advertised, every command the export offers succeeds with FUA set (older
    /// qemu sends FLUSH with FUA; READ and FLUSH with FUA were refused with EINVAL).
    #[tokio::test]
    async fn fua_is_accepted_on_every_command() {
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let session = tokio::spawn(serve_connection(server, exports, shutdown));
        connect(&mut client).await;
        let fua = proto::CMD_FLAG_FUA;
        let cases = [
            ("WRITE", proto::CMD_WRITE, fua, 0, 4096),
            ("READ", proto::CMD_READ, fua, 0, 4096),
            ("READ with DF", proto::CMD_READ, fua | proto::CMD_FLAG_DF, 0, 4096),
            ("FLUSH", proto::CMD_FLUSH, fua, 0, 0),
            ("TRIM", proto::CMD_TRIM, fua, 0, 4096),
            ("WRITE_ZEROES", proto::CMD_WRITE_ZEROES, fua, 8192, 4096),
            (
                "WRITE_ZEROES NO_HOLE",
                proto::CMD_WRITE_ZEROES,
                fua | proto::CMD_FLAG_NO_HOLE,
                0,
                4096,
            ),
            ("BLOCK_STATUS", proto::CMD_BLOCK_STATUS, fua, 0, 65536),
        ];
        for (cookie, (name, kind, flags, offset, len)) in cases.into_iter().enumerate() {
            let r = Request { flags, kind, cookie: cookie as u64, offset, len };
            let payload = if kind == proto::CMD_WRITE { vec![7u8; len as usize] } else { vec![] };
            assert_eq!(request(&mut client, r, &payload).await, 0, "{name} with FUA");
        }
        // An unknown flag beside FUA is still refused, and the session goes on.
        let bad =
            Request { flags: fua | 1 << 9, kind: proto::CMD_READ, cookie: 99, offset: 0, len: 512 };
        assert_eq!(request(&mut client, bad, &[]).await, proto::EINVAL);
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 100, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// Payloads are read exactly: two writes sent in one burst land where they should, and
    /// a write whose payload is cut off by a disconnect changes nothing.
    #[tokio::test]
    async fn payloads_end_where_their_requests_say() {
        let store = store().await;
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (mut client, session) = socket_session(&exports, &shutdown);
        connect(&mut client).await;
        let write =
            |cookie, offset, len| Request { flags: 0, kind: proto::CMD_WRITE, cookie, offset, len };
        let mut burst = write(1, 0, 8192).encode().to_vec();
        burst.extend_from_slice(&[1u8; 8192]);
        burst.extend_from_slice(&write(2, 8192, 4096).encode());
        burst.extend_from_slice(&[2u8; 4096]);
        client.write_all(&burst).await.unwrap();
        for _ in 0..2 {
            assert_eq!(client.read_u32().await.unwrap(), proto::SIMPLE_REPLY_MAGIC);
            assert_eq!(client.read_u32().await.unwrap(), 0, "the write succeeds");
            client.read_u64().await.unwrap();
        }
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 3, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
        let volume = Volume::open(&store, "vol0").unwrap();
        let mut want = vec![1u8; 8192];
        want.extend_from_slice(&[2u8; 4096]);
        assert_eq!(volume.read(0, 12288).await.unwrap(), want);
        // Half a payload, then the client is gone.
        let (mut client, session) = socket_session(&exports, &shutdown);
        connect(&mut client).await;
        client.write_all(&write(4, 16384, 65536).encode()).await.unwrap();
        client.write_all(&[9u8; 32768]).await.unwrap();
        drop(client);
        assert!(session.await.unwrap().is_err(), "a payload cut off ends the connection");
        assert_eq!(volume.read(16384, 65536).await.unwrap(), vec![0u8; 65536]);
    }

    /// A structured read's bytes as the client puts them together (holes as zeros).
    async fn read_structured(client: &mut impl Client, request: Request) -> Vec<u8> {
        client.write_all(&request.encode()).await.unwrap();
        let mut out = vec![0xeeu8; request.len as usize];
        loop {
            assert_eq!(client.read_u32().await.unwrap(), proto::STRUCTURED_REPLY_MAGIC);
            let flags = client.read_u16().await.unwrap();
            let kind = client.read_u16().await.unwrap();
            assert_eq!(client.read_u64().await.unwrap(), request.cookie);
            let len = client.read_u32().await.unwrap() as usize;
            let mut chunk = vec![0u8; len];
            client.read_exact(&mut chunk).await.unwrap();
            let at = |c: &[u8]| {
                let offset = u64::from_be_bytes(c[..8].try_into().unwrap());
                (offset - request.offset) as usize
            };
            match kind {
                proto::REPLY_TYPE_OFFSET_DATA => {
                    let from = at(&chunk);
                    out[from..from + len - 8].copy_from_slice(&chunk[8..]);
                }
                proto::REPLY_TYPE_OFFSET_HOLE => {
                    let (from, n) =
                        (at(&chunk), u32::from_be_bytes(chunk[8..12].try_into().unwrap()));
                    out[from..from + n as usize].fill(0);
                }
                kind => panic!("chunk type {kind}"),
            }
            if flags & proto::REPLY_FLAG_DONE != 0 {
                return out;
            }
        }
    }

    /// A read's reply carries exactly the bytes written, holes as hole chunks or zeros, when
    /// its data lies in more separate buffers than one vectored write takes (4 KiB blocks
    /// each dirty in its own buffer: 2,048 of them in 8 MiB, against a limit of 1,024 slices a
    /// call), with structured replies with and without DF, and with simple replies.
    #[tokio::test]
    async fn reads_reply_with_the_bytes_of_many_buffers() {
        let store = store().await;
        let volume = Volume::open(&store, "vol0").unwrap();
        let block = |i: usize| vec![(i % 251) as u8 + 1; 4096];
        let mut expected = vec![0u8; 9 << 20];
        for i in 0..(9 << 20) / 4096 {
            // A hole of 64 KiB in the middle.
            if !(1024..1040).contains(&i) {
                expected[i * 4096..(i + 1) * 4096].copy_from_slice(&block(i));
            }
        }
        volume.write(0, &expected[..1024 * 4096], false).await.unwrap();
        volume.write(1040 * 4096, &expected[1040 * 4096..], false).await.unwrap();
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (mut client, session) = socket_session(&exports, &shutdown);
        connect(&mut client).await;
        let read = |flags, cookie| Request {
            flags,
            kind: proto::CMD_READ,
            cookie,
            offset: 4096,
            len: (9 << 20) - 8192,
        };
        let want = &expected[4096..(9 << 20) - 4096];
        assert!(read_structured(&mut client, read(0, 1)).await == want, "structured read");
        let df = read_structured(&mut client, read(proto::CMD_FLAG_DF, 2)).await;
        assert!(df == want, "structured read with DF");
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 3, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
        // Simple replies: the old-style handshake without structured replies.
        let (mut client, session) = socket_session(&exports, &shutdown);
        hello(&mut client).await;
        option(&mut client, proto::OPT_GO, &go_data(b"vol0")).await;
        option_replies(&mut client).await;
        client.write_all(&read(0, 4).encode()).await.unwrap();
        assert_eq!(client.read_u32().await.unwrap(), proto::SIMPLE_REPLY_MAGIC);
        assert_eq!(client.read_u32().await.unwrap(), 0, "the simple read succeeds");
        assert_eq!(client.read_u64().await.unwrap(), 4);
        let mut data = vec![0u8; want.len()];
        client.read_exact(&mut data).await.unwrap();
        assert!(data == want, "simple read");
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// Replies without data (buffered) and read replies (sent straight from the engine's
    /// buffers) keep to whole replies on the wire when a burst of writes, reads and flushes
    /// is in flight at once: every request is answered once, each read with its own bytes.
    #[tokio::test]
    async fn buffered_and_direct_replies_do_not_interleave() {
        let store = store().await;
        let volume = Volume::open(&store, "vol0").unwrap();
        let block = |i: u64| vec![(i % 251) as u8 + 1; 4096];
        for i in 0..64 {
            volume.write(i * 4096, &block(i), false).await.unwrap();
        }
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (mut client, session) = socket_session(&exports, &shutdown);
        connect(&mut client).await;
        let mut burst = Vec::new();
        for i in 0..64u64 {
            let (offset, len) = ((64 + i) * 4096, 4096);
            let write = Request { flags: 0, kind: proto::CMD_WRITE, cookie: 3 * i, offset, len };
            burst.extend_from_slice(&write.encode());
            burst.extend_from_slice(&block(100 + i));
            let (kind, cookie, offset) = (proto::CMD_READ, 3 * i + 1, i * 4096);
            burst.extend_from_slice(&Request { flags: 0, kind, cookie, offset, len }.encode());
            let flush =
                Request { flags: 0, kind: proto::CMD_FLUSH, cookie: 3 * i + 2, offset: 0, len: 0 };
            burst.extend_from_slice(&flush.encode());
        }
        client.write_all(&burst).await.unwrap();
        let mut answered = std::collections::BTreeSet::new();
        while answered.len() < 3 * 64 {
            match client.read_u32().await.unwrap() {
                proto::SIMPLE_REPLY_MAGIC => {
                    assert_eq!(client.read_u32().await.unwrap(), 0, "writes and flushes succeed");
                    let cookie = client.read_u64().await.unwrap();
                    assert_ne!(cookie % 3, 1, "a read is answered with a structured reply");
                    assert!(answered.insert(cookie), "cookie {cookie} answered twice");
                }
                proto::STRUCTURED_REPLY_MAGIC => {
                    let flags = client.read_u16().await.unwrap();
                    assert_eq!(client.read_u16().await.unwrap(), proto::REPLY_TYPE_OFFSET_DATA);
                    let cookie = client.read_u64().await.unwrap();
                    assert_eq!(cookie % 3, 1, "only reads carry data");
                    assert_eq!(client.read_u32().await.unwrap(), 8 + 4096);
                    let i = cookie / 3;
                    assert_eq!(client.read_u64().await.unwrap(), i * 4096);
                    let mut data = vec![0u8; 4096];
                    client.read_exact(&mut data).await.unwrap();
                    assert!(data == block(i), "read {i} carries its own bytes");
                    assert_ne!(flags & proto::REPLY_FLAG_DONE, 0, "one chunk per 4 KiB read");
                    assert!(answered.insert(cookie), "cookie {cookie} answered twice");
                }
                magic => panic!("reply magic {magic:#x}: replies interleaved"),
            }
        }
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 999, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
        for i in 0..64 {
            assert_eq!(volume.read((64 + i) * 4096, 4096).await.unwrap(), block(100 + i));
        }
    }

    /// A socket that counts the writes (plain or vectored) that reached it.
    struct CountingWrites {
        inner: tokio::net::UnixStream,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl CountingWrites {
        fn count(&self, result: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
            if let Poll::Ready(Ok(1..)) = result {
                self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            result
        }
    }

    impl tokio::io::AsyncRead for CountingWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for CountingWrites {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let result = Pin::new(&mut self.inner).poll_write(cx, buf);
            self.count(result)
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
            self.count(result)
        }

        fn is_write_vectored(&self) -> bool {
            self.inner.is_write_vectored()
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A client's queued reads that complete together are answered together: 32 reads sent in
    /// one burst, whose data is in memory, reach the socket in a few vectored writes, not one
    /// each (a `writev` per reply kept the serving core writing while the client's next
    /// requests waited), and every read still carries its own bytes.
    #[tokio::test]
    async fn queued_reads_are_answered_in_few_writes() {
        let store = store().await;
        let volume = Volume::open(&store, "vol0").unwrap();
        let block = |i: u64| vec![(i % 251) as u8 + 1; 4096];
        for i in 0..32 {
            volume.write(i * 4096, &block(i), false).await.unwrap();
        }
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (mut client, server) = tokio::net::UnixStream::pair().unwrap();
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = CountingWrites { inner: server, writes: Arc::clone(&writes) };
        let session = tokio::spawn(serve_connection(counted, Arc::clone(&exports), shutdown));
        connect(&mut client).await;
        let handshake = writes.load(std::sync::atomic::Ordering::Relaxed);
        let mut burst = Vec::new();
        for i in 0..32u64 {
            let read =
                Request { flags: 0, kind: proto::CMD_READ, cookie: i, offset: i * 4096, len: 4096 };
            burst.extend_from_slice(&read.encode());
        }
        client.write_all(&burst).await.unwrap();
        let mut answered = std::collections::BTreeSet::new();
        while answered.len() < 32 {
            assert_eq!(client.read_u32().await.unwrap(), proto::STRUCTURED_REPLY_MAGIC);
            let flags = client.read_u16().await.unwrap();
            assert_ne!(flags & proto::REPLY_FLAG_DONE, 0, "one chunk per 4 KiB read");
            assert_eq!(client.read_u16().await.unwrap(), proto::REPLY_TYPE_OFFSET_DATA);
            let cookie = client.read_u64().await.unwrap();
            assert_eq!(client.read_u32().await.unwrap(), 8 + 4096);
            assert_eq!(client.read_u64().await.unwrap(), cookie * 4096);
            let mut data = vec![0u8; 4096];
            client.read_exact(&mut data).await.unwrap();
            assert!(data == block(cookie), "read {cookie} carries its own bytes");
            assert!(answered.insert(cookie), "cookie {cookie} answered twice");
        }
        let sent = writes.load(std::sync::atomic::Ordering::Relaxed) - handshake;
        assert!(sent <= 4, "32 queued reads answered in {sent} writes");
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 999, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// With TLS required, options before STARTTLS get TLS_REQD and nothing else; after it,
    /// haggling starts over inside TLS (no second greeting) and the session works.
    #[tokio::test]
    async fn tls_required_refuses_options_until_starttls() {
        let dir = tempfile::tempdir().unwrap();
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let tls = Some(tls(dir.path(), true));
        let session = tokio::spawn(serve_connection_tls(server, exports, shutdown, tls));
        hello(&mut client).await;
        for (opt, data) in [
            (proto::OPT_GO, go_data(b"vol0")),
            (proto::OPT_INFO, go_data(b"vol0")),
            (proto::OPT_LIST, vec![]),
            (proto::OPT_STRUCTURED_REPLY, vec![]),
            (99, vec![1, 2, 3]),
        ] {
            option(&mut client, opt, &data).await;
            let (replied, kind, _) = reply(&mut client).await;
            assert_eq!((replied, kind), (opt, proto::REP_ERR_TLS_REQD), "option {opt}");
        }
        option(&mut client, proto::OPT_STARTTLS, b"x").await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ERR_INVALID, "STARTTLS with data");
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ACK);
        let mut client = psk_handshake(client, "alice", KEY).await.unwrap();
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ERR_INVALID, "a second STARTTLS");
        go(&mut client).await;
        let write = Request { flags: 0, kind: proto::CMD_WRITE, cookie: 1, offset: 0, len: 4096 };
        assert_eq!(request(&mut client, write, &[7u8; 4096]).await, 0);
        let read = Request { flags: 0, kind: proto::CMD_READ, cookie: 2, offset: 0, len: 4096 };
        assert_eq!(request(&mut client, read, &[]).await, 0);
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 3, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// A client naming a PSK identity it has no key for, offering only a suite OpenSSL will
    /// not use that key with, may finish a certificate handshake instead; it must not pass an
    /// allow-list as that identity.
    #[tokio::test]
    async fn a_psk_identity_without_its_key_does_not_pass_the_allow_list() {
        use openssl::asn1::Asn1Time;
        use openssl::bn::BigNum;
        use openssl::hash::MessageDigest;
        use openssl::pkey::PKey;
        use openssl::rsa::Rsa;
        use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
        use openssl::x509::{X509Builder, X509NameBuilder};
        let dir = tempfile::tempdir().unwrap();
        let key = PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "localhost").unwrap();
        let name = name.build();
        let mut cert = X509Builder::new().unwrap();
        cert.set_version(2).unwrap();
        cert.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap()).unwrap();
        cert.set_subject_name(&name).unwrap();
        cert.set_issuer_name(&name).unwrap();
        cert.set_pubkey(&key).unwrap();
        cert.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
        cert.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
        cert.sign(&key, MessageDigest::sha256()).unwrap();
        let cert = cert.build();
        std::fs::write(dir.path().join("server-cert.pem"), cert.to_pem().unwrap()).unwrap();
        let pem = key.private_key_to_pem_pkcs8().unwrap();
        std::fs::write(dir.path().join("server-key.pem"), pem).unwrap();
        let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
        let psk = dir.path().join("keys.psk");
        std::fs::write(&psk, format!("alice:{hex}\n")).unwrap();
        let settings = TlsSettings {
            require: true,
            certificates: Some(dir.path().to_owned()),
            psk: Some(psk),
            allow: crate::tls::AllowList::parse(&["vol0=alice"]).unwrap(),
            ..TlsSettings::default()
        };
        let tls = Some(Arc::new(TlsServer::new(&settings).unwrap()));
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let session = tokio::spawn(serve_connection_tls(server, exports, shutdown, tls));
        hello(&mut client).await;
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ACK);
        let mut builder = SslConnector::builder(SslMethod::tls_client()).unwrap();
        builder.set_verify(SslVerifyMode::NONE);
        builder.set_ciphersuites("TLS_AES_256_GCM_SHA384").unwrap();
        builder.set_psk_client_callback(|_, _, id, psk| {
            id[..5].copy_from_slice(b"alice");
            id[5] = 0;
            psk[..32].fill(0x55);
            Ok(32)
        });
        let ssl = builder.build().configure().unwrap().into_ssl("localhost").unwrap();
        let mut stream = tokio_openssl::SslStream::new(ssl, client).unwrap();
        if std::pin::Pin::new(&mut stream).connect().await.is_ok() {
            option(&mut stream, proto::OPT_GO, &go_data(b"vol0")).await;
            let (_, kind, _) = reply(&mut stream).await;
            assert_eq!(kind, proto::REP_ERR_POLICY, "the allow-list took a forged identity");
        }
        drop(stream);
        let _ = session.await.unwrap();
    }

    /// EXPORT_NAME has no error reply: before STARTTLS under require it closes the connection.
    #[tokio::test]
    async fn export_name_before_starttls_closes_under_require() {
        let dir = tempfile::tempdir().unwrap();
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let tls = Some(tls(dir.path(), true));
        let session = tokio::spawn(serve_connection_tls(server, exports, shutdown, tls));
        hello(&mut client).await;
        option(&mut client, proto::OPT_EXPORT_NAME, b"vol0").await;
        let result = session.await.unwrap();
        assert!(matches!(result, Err(ConnectionError::Refused(_))), "{result:?}");
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the server answered: {rest:?}");
    }

    /// A wrong key fails the handshake; bytes sent behind STARTTLS before its reply end the
    /// connection; with TLS offered (not required) a plain client is served.
    #[tokio::test]
    async fn wrong_keys_early_bytes_and_plain_clients_under_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store().await;
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let tls = tls(dir.path(), false);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);

        let (mut client, server) = tokio::io::duplex(1 << 20);
        let session = tokio::spawn(serve_connection_tls(
            server,
            Arc::clone(&exports),
            shutdown.clone(),
            Some(Arc::clone(&tls)),
        ));
        hello(&mut client).await;
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ACK);
        assert!(psk_handshake(client, "alice", [1; 32]).await.is_err());
        let result = session.await.unwrap();
        assert!(matches!(result, Err(ConnectionError::Tls(_))), "{result:?}");

        let (mut client, server) = tokio::io::duplex(1 << 20);
        let session = tokio::spawn(serve_connection_tls(
            server,
            Arc::clone(&exports),
            shutdown.clone(),
            Some(Arc::clone(&tls)),
        ));
        hello(&mut client).await;
        let mut early = proto::OPTS_MAGIC.to_be_bytes().to_vec();
        early.extend_from_slice(&proto::OPT_STARTTLS.to_be_bytes());
        early.extend_from_slice(&0u32.to_be_bytes());
        early.extend_from_slice(b"too soon");
        client.write_all(&early).await.unwrap();
        let result = session.await.unwrap();
        assert!(matches!(result, Err(ConnectionError::Protocol(_))), "{result:?}");

        let (mut client, server) = tokio::io::duplex(1 << 20);
        let session =
            tokio::spawn(serve_connection_tls(server, exports, shutdown, Some(Arc::clone(&tls))));
        connect(&mut client).await;
        let read = Request { flags: 0, kind: proto::CMD_READ, cookie: 1, offset: 0, len: 512 };
        assert_eq!(request(&mut client, read, &[]).await, 0);
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 2, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// A TLS 1.2 client with a PSK gets an ECDHE-PSK suite from a server with no certificate.
    #[tokio::test]
    async fn tls12_psk_clients_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let tls = Some(tls(dir.path(), true));
        let session = tokio::spawn(serve_connection_tls(server, exports, shutdown, tls));
        hello(&mut client).await;
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ACK);
        let tls12 = Some(openssl::ssl::SslVersion::TLS1_2);
        let mut client = psk_handshake_up_to(client, "alice", KEY, tls12).await.unwrap();
        assert_eq!(client.ssl().version_str(), "TLSv1.2");
        go(&mut client).await;
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 1, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// A large write over TLS, sent in pieces with pauses between them (so the server finds
    /// nothing decrypted waiting and writes the blocks it holds ahead), lands whole and in
    /// order: every byte differs from its neighbours, so a block out of place would show.
    #[tokio::test]
    async fn a_large_write_over_tls_sent_in_pieces_lands_whole() {
        const LEN: usize = 1 << 20;
        const OFFSET: u64 = 3 << 20;
        let dir = tempfile::tempdir().unwrap();
        let store = store().await;
        let (client, server) = tokio::io::duplex(64 << 10);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let tls = Some(tls(dir.path(), true));
        let session = tokio::spawn(serve_connection_tls(server, exports, shutdown, tls));
        let mut client = client;
        hello(&mut client).await;
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ACK);
        let mut client = psk_handshake(client, "alice", KEY).await.unwrap();
        go(&mut client).await;
        let payload: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
        let write = Request {
            flags: 0,
            kind: proto::CMD_WRITE,
            cookie: 7,
            offset: OFFSET,
            len: LEN as u32,
        };
        client.write_all(&write.encode()).await.unwrap();
        for piece in payload.chunks(100_000) {
            client.write_all(piece).await.unwrap();
            client.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(client.read_u32().await.unwrap(), proto::SIMPLE_REPLY_MAGIC);
        assert_eq!(client.read_u32().await.unwrap(), 0, "the write succeeded");
        assert_eq!(client.read_u64().await.unwrap(), 7);
        let flush = Request { flags: 0, kind: proto::CMD_FLUSH, cookie: 8, offset: 0, len: 0 };
        assert_eq!(request(&mut client, flush, &[]).await, 0);
        let volume = Volume::open(&store, "vol0").unwrap();
        let got = volume.read(OFFSET, LEN as u64).await.unwrap();
        assert!(got == payload, "the write, whole and in order");
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 9, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// Without TLS, STARTTLS is refused with POLICY and the session goes on in plain text.
    #[tokio::test]
    async fn starttls_is_refused_when_tls_is_off() {
        let store = store().await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let exports: Arc<dyn Exports> = Arc::new(OneVolume(Arc::clone(&store)));
        let session = tokio::spawn(serve_connection(server, exports, shutdown));
        hello(&mut client).await;
        option(&mut client, proto::OPT_STARTTLS, &[]).await;
        assert_eq!(reply(&mut client).await.1, proto::REP_ERR_POLICY);
        go(&mut client).await;
        let disc = Request { flags: 0, kind: proto::CMD_DISC, cookie: 1, offset: 0, len: 0 };
        client.write_all(&disc.encode()).await.unwrap();
        session.await.unwrap().unwrap();
    }

    /// A large write's whole blocks are written as they arrive: parts of them while the
    /// socket waits for the client's next bytes, in order, the last block never; the rest is
    /// the request's own write. So through a plain socket's descriptor and through the stream
    /// alone (as over TLS, whose bytes come decrypted through it). A part the volume refuses
    /// (a snapshot's, read-only) ends the writing ahead with its error, and the payload is
    /// still read to its end.
    #[tokio::test]
    async fn a_large_payloads_blocks_are_written_as_they_arrive() {
        use crate::placement::{CoreStream, Movable};
        const BLOCK: usize = 4096;
        const LEN: usize = 1 << 20;
        const OFFSET: u64 = 1 << 20;
        let store = store().await;
        store.create_snapshots(&[("vol0".into(), "s".into())], 1).await.unwrap();
        let payload: Vec<u8> = (0..LEN).map(|i| (i * 29 % 253) as u8).collect();
        let runs = [("vol0", true), ("vol0@s", true), ("vol0", false), ("vol0@s", false)];
        for (name, direct) in runs {
            let volume = Volume::open(&store, name).unwrap();
            let (client, server) = tokio::net::UnixStream::pair().unwrap();
            let server = CoreStream::from(server);
            let fd = server.socket_fd();
            assert!(fd.is_some(), "a plain socket's descriptor");
            let fd = fd.filter(|_| direct);
            let name = format!("{name} (direct: {direct})");
            // Each way into a range of its own: what one left cannot pass for the other's.
            let offset = if direct { OFFSET } else { 3 * OFFSET };
            let (reader, _writer) = tokio::io::split(server);
            let mut reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
            let (_client_reader, mut client) = client.into_split();
            let sent = payload.clone();
            let sender = tokio::spawn(async move {
                // Pauses long enough for the reader to find the socket empty between pieces.
                for piece in sent.chunks(100_000) {
                    client.write_all(piece).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                client.write_all(b"next").await.unwrap();
                client
            });
            let ahead = Some(super::Ahead { volume: &volume, offset });
            let received = read_blocks(&mut reader, fd, LEN, BLOCK, true, ahead).await.unwrap();
            let mut next = [0u8; 4];
            reader.read_exact(&mut next).await.unwrap();
            assert_eq!(&next, b"next", "{name}: the payload was read to its end");
            let _client = sender.await.unwrap();
            let ahead = received.ahead as usize;
            assert!(ahead > 0 && ahead % BLOCK == 0, "{name}: whole blocks written ahead");
            assert_eq!(received.rest.len(), (LEN - ahead) / BLOCK, "{name}: the rest");
            if name.starts_with("vol0@s") {
                let Some(super::AheadFailed::Store(failed)) = received.failed else {
                    panic!("{name}: a snapshot refuses writes: {:?}", received.failed);
                };
                assert!(failed.to_string().contains("read-only"), "{name}: {failed}");
                // One part, from the client's first pieces; none after it failed.
                assert!(
                    ahead < 2 * super::AHEAD_PART_BYTES_MIN,
                    "{name}: written ahead after a failure: {ahead}"
                );
                continue;
            }
            assert!(received.failed.is_none());
            assert!(ahead < LEN - BLOCK, "the last block is the request's own write");
            let got = volume.read(offset, ahead as u64).await.unwrap();
            assert!(got == payload[..ahead], "the parts written ahead, in place");
            volume.write_blocks(offset + ahead as u64, received.rest, false).await.unwrap();
            let got = volume.read(offset, LEN as u64).await.unwrap();
            assert!(got == payload, "the whole write");
        }
    }

    /// A write of whole blocks is received into a buffer per block: what the connection's
    /// buffer held first, then vectored receives straight from the socket (or, without its
    /// descriptor, reads through the stream), every byte in order and none past the payload
    /// taken; a payload cut off is an error, not a short block.
    #[tokio::test]
    async fn a_payload_of_whole_blocks_is_received_into_its_blocks() {
        use crate::placement::{CoreStream, Movable};
        use tokio::io::AsyncBufReadExt;
        const BLOCK: usize = 16 << 10;
        const LEN: usize = 5 * BLOCK;
        let payload: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
        for direct in [true, false] {
            let (client, server) = tokio::net::UnixStream::pair().unwrap();
            let server = CoreStream::from(server);
            let fd = server.socket_fd().filter(|_| direct);
            let (reader, _writer) = tokio::io::split(server);
            let mut reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
            let (_client_reader, mut client) = client.into_split();
            // The payload's start in the connection's buffer, as when it came with its header.
            client.write_all(&payload[..5000]).await.unwrap();
            assert!(!reader.fill_buf().await.unwrap().is_empty());
            let rest = payload[5000..].to_vec();
            let sender = tokio::spawn(async move {
                for piece in rest.chunks(7001) {
                    client.write_all(piece).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                // The next request's first bytes, right behind the payload.
                client.write_all(b"next").await.unwrap();
                client
            });
            let received = read_blocks(&mut reader, fd, LEN, BLOCK, true, None).await.unwrap();
            assert_eq!(received.ahead, 0, "nothing written ahead without a volume");
            let blocks = received.rest;
            assert_eq!(blocks.len(), LEN / BLOCK);
            assert!(blocks.iter().all(|b| b.len() == BLOCK));
            let got: Vec<u8> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
            assert!(got == payload, "the payload's bytes, in order (direct: {direct})");
            for block in &blocks {
                let sum = sluice_format::ChecksumAlg::Xxh3_128.compute(block);
                assert_eq!(block.xxh3(), Some(sum), "each block's checksum, taken on arrival");
            }
            let mut next = [0u8; 4];
            reader.read_exact(&mut next).await.unwrap();
            assert_eq!(&next, b"next", "the bytes after the payload stay in the stream");
            // A block and a bit, then the client is gone.
            let mut client = sender.await.unwrap();
            client.write_all(&payload[..BLOCK + 10]).await.unwrap();
            drop(client);
            let cut = read_blocks(&mut reader, fd, LEN, BLOCK, true, None).await;
            assert_eq!(cut.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
        }
    }
}
