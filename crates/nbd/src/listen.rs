//! Where connections come from, and a clean stop.
//!
//! Each accepted connection runs as its own task. On shutdown the listeners stop accepting,
//! every connection stops reading new requests, answers those it has, and closes; the caller
//! then syncs and exports the pool.
//!
//! Sockets passed by socket activation are taken in two steps. [`take_inherited`] reads and
//! clears `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES` and owns the fds; it changes the
//! environment, so it runs at the start of `main` while the process has one thread.
//! [`Inherited::into_listeners`] registers them with tokio, so it runs inside the runtime.
//!
//! `--stdio` serves one client on stdin and stdout ([`serve_stdio`]): as an accepted local
//! connection when they are one Unix socket, as libnbd launches a server, and through tokio's
//! stdin and stdout otherwise.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::placement::{CoreStream, Movable, Placed, Placement};
use crate::server::{serve_connection_tls, serve_placed, Exports};
use crate::tls::TlsServer;

/// A listening socket of either family.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Adopts an inherited listening socket (already bound and listening). Must run inside a
    /// tokio runtime, which registers the socket with its reactor.
    pub fn from_owned(socket: OwnedFd) -> std::io::Result<Listener> {
        // SAFETY: sockaddr_storage is plain old data; all zeros is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: storage is large enough for any address, len says how large, and the fd is
        // open for as long as `socket` lives.
        let rc = unsafe {
            libc::getsockname(
                socket.as_raw_fd(),
                (&raw mut storage).cast::<libc::sockaddr>(),
                &raw mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if i32::from(storage.ss_family) == libc::AF_UNIX {
            let std_listener = std::os::unix::net::UnixListener::from(socket);
            std_listener.set_nonblocking(true)?;
            Ok(Listener::Unix(UnixListener::from_std(std_listener)?))
        } else {
            let std_listener = std::net::TcpListener::from(socket);
            std_listener.set_nonblocking(true)?;
            Ok(Listener::Tcp(TcpListener::from_std(std_listener)?))
        }
    }
}

/// The first file descriptor socket activation passes (after stdin, stdout, stderr).
const LISTEN_FDS_START: RawFd = 3;
/// More inherited sockets than this are not a configuration anyone means; the rest are left
/// alone.
pub const INHERITED_FDS_MAX: RawFd = 64;

/// Listening sockets passed by systemd-style socket activation, taken from the environment at
/// startup ([`take_inherited`]) and turned into listeners once a runtime runs
/// ([`Inherited::into_listeners`]).
#[derive(Debug, Default)]
pub struct Inherited {
    fds: Vec<OwnedFd>,
}

impl Inherited {
    /// The sockets as listeners. Must run inside a tokio runtime.
    pub fn into_listeners(self) -> Result<Vec<Listener>, InheritError> {
        self.fds
            .into_iter()
            .map(|fd| {
                let number = fd.as_raw_fd();
                Listener::from_owned(fd)
                    .map_err(|source| InheritError::Adopt { fd: number, source })
            })
            .collect()
    }
}

/// Why inherited sockets could not be taken or adopted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InheritError {
    #[error(
        "LISTEN_FDS says fd {fd} is passed, but it is not open: check the socket unit (or \
         the program that started sluice) passes what LISTEN_FDS counts"
    )]
    NotOpen {
        fd: RawFd,
        #[source]
        source: std::io::Error,
    },
    #[error("inherited fd {fd} (LISTEN_FDS) is not a listening socket sluice can use")]
    Adopt {
        fd: RawFd,
        #[source]
        source: std::io::Error,
    },
}

/// Takes the listening sockets passed by systemd-style socket activation (`LISTEN_PID` is
/// this process, `LISTEN_FDS` counts them from fd 3), and removes `LISTEN_PID`, `LISTEN_FDS`
/// and `LISTEN_FDNAMES` so no child adopts the same sockets. Variables meant for another
/// process (a different `LISTEN_PID`) are left as they are, and so are their fds. The fds
/// taken are marked close-on-exec, as `sd_listen_fds` does.
///
/// # Safety
/// The process must have a single thread: removing environment variables races with any
/// other thread reading or writing the environment (libc's `getenv` included), so call this
/// at the start of `main`, before a runtime, a thread pool or any thread starts. Call it at
/// most once: from then on the fds belong to the [`Inherited`] it returns.
pub unsafe fn take_inherited() -> Result<Inherited, InheritError> {
    let pid_matches = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    if !pid_matches {
        return Ok(Inherited::default());
    }
    let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<RawFd>().ok());
    // SAFETY: the caller guarantees no other thread exists to read the environment while it
    // changes.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let Some(count) = count else { return Ok(Inherited::default()) };
    let mut fds = Vec::new();
    for fd in LISTEN_FDS_START..LISTEN_FDS_START + count.clamp(0, INHERITED_FDS_MAX) {
        // SAFETY: F_GETFD only reads the descriptor's flags, and fails on a closed fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            return Err(InheritError::NotOpen { fd, source: std::io::Error::last_os_error() });
        }
        // SAFETY: as above; setting FD_CLOEXEC changes only what exec does with the fd.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: socket activation hands fds 3.. to this process (LISTEN_PID says so), the
        // fd is open (checked above), and the caller takes them once, so nothing else owns it.
        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Ok(Inherited { fds })
}

/// Accepts connections on every listener until `shutdown` turns true, then waits for the open
/// connections to finish their requests. `tls` applies to every listener alike.
pub async fn serve(
    listeners: Vec<Listener>,
    exports: Arc<dyn Exports>,
    shutdown: watch::Receiver<bool>,
    placement: Placement,
    tls: Option<Arc<TlsServer>>,
) {
    let mut acceptors = JoinSet::new();
    for listener in listeners {
        let (exports, shutdown) = (Arc::clone(&exports), shutdown.clone());
        let tls = tls.clone();
        acceptors.spawn(accept_loop(listener, exports, shutdown, placement.clone(), tls));
    }
    while acceptors.join_next().await.is_some() {}
}

async fn accept_loop(
    listener: Listener,
    exports: Arc<dyn Exports>,
    mut shutdown: watch::Receiver<bool>,
    placement: Placement,
    tls: Option<Arc<TlsServer>>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = accept(&listener) => accepted,
        };
        let (exports, shutdown, tls) = (Arc::clone(&exports), shutdown.clone(), tls.clone());
        let placed = accepted.and_then(|stream| {
            let (mut stream, peer) = match stream {
                Stream::Unix(stream) => {
                    note_send_buffer(widen_send_buffer(stream.as_raw_fd()));
                    (CoreStream::from(stream), None)
                }
                Stream::Tcp(stream) => {
                    // Replies are small and latency matters more than packing them.
                    let _ = stream.set_nodelay(true);
                    // Which client a failure was (a failed TLS handshake, say) on a network.
                    let peer =
                        stream.peer_addr().map_or_else(|_| String::from("?"), |a| a.to_string());
                    (CoreStream::from(stream), Some(peer))
                }
            };
            let reported = move |result| match &peer {
                Some(peer) => report_from(result, peer),
                None => report(result),
            };
            let Some((here, core)) = placement.next() else {
                connections.spawn(async move {
                    reported(serve_placed(stream, exports, shutdown, tls, None).await)
                });
                return Ok(());
            };
            // A connection accepted onto another core is handed over as a plain socket and
            // registered with that core's reactor there, so its handshake's I/O happens on
            // that core (and then on its volume's core: placement.rs).
            stream.detach()?;
            let placed = Placed { placement: placement.clone(), here };
            connections.spawn_on(
                async move {
                    let served = match stream.attach() {
                        Ok(()) => serve_placed(stream, exports, shutdown, tls, Some(placed)).await,
                        Err(e) => Err(e.into()),
                    };
                    reported(served)
                },
                core,
            );
            Ok(())
        });
        if let Err(error) = placed {
            eprintln!("sluice: accepting a connection: {error}");
        }
        // Reap finished connections as we go.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}

/// The send buffer asked for on a local connection: the kernel doubles it, so about 8 MiB of
/// replies (eight 1 MiB reads) queue for the client before a send stops short.
const UNIX_SEND_BUFFER_BYTES: libc::c_int = 4 << 20;

/// A connection's send buffer, as the kernel reports it, before and after
/// [`widen_send_buffer`].
#[derive(Clone, Copy, Debug)]
struct SendBuffer {
    before: usize,
    after: usize,
}

/// Widens a local (Unix-domain) connection's send buffer to twice [`UNIX_SEND_BUFFER_BYTES`]
/// unless it is that wide already. A Unix stream's sender holds every byte the receiver has
/// not read yet, so with the default (`net.core.wmem_default`, 208 KiB) a 1 MiB read's reply
/// left in five sends, and the client, reading on the other core, was woken for each piece
/// and the server for the room it made: about five context switches per MiB served, against
/// 0.1-0.6 with 8 MiB. Measured in paired runs (`bench/ab.sh ... -- sluice seqread`; the
/// VM's CPUs were contended then, which made each wake-up dearer): 1 MiB reads 3.2x the
/// MiB/s at 0.45x the server's CPU per MiB with no data cached, 4.9x at 0.55x cached
/// (docs/bench/peers-notes.md, 2026-12-07 02:48Z). `SO_SNDBUFFORCE` needs `CAP_NET_ADMIN` in
/// the initial user namespace and passes over `net.core.wmem_max`; without it (as under the
/// shipped systemd unit, which keeps no capabilities) `SO_SNDBUF` gets twice `wmem_max` at
/// most (416 KiB on a stock kernel). TCP connections keep the kernel's autotuning, which
/// setting the size would turn off.
fn widen_send_buffer(fd: RawFd) -> std::io::Result<SendBuffer> {
    let wanted = 2 * UNIX_SEND_BUFFER_BYTES as usize;
    let before = send_buffer(fd)?;
    if before >= wanted {
        return Ok(SendBuffer { before, after: before });
    }
    let set = |option| {
        let value = UNIX_SEND_BUFFER_BYTES;
        // SAFETY: `value` is a c_int that outlives the call, and its size is passed with it.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&raw const value).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_SNDBUFFORCE) != 0 && set(libc::SO_SNDBUF) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(SendBuffer { before, after: send_buffer(fd)? })
}

/// Whether `fd` is a Unix-domain stream socket (`SO_DOMAIN`, `SO_TYPE`); false for anything
/// that is no socket.
fn is_unix_stream(fd: RawFd) -> bool {
    socket_option(fd, libc::SO_DOMAIN).ok() == Some(libc::AF_UNIX)
        && socket_option(fd, libc::SO_TYPE).ok() == Some(libc::SOCK_STREAM)
}

/// The socket's send buffer as the kernel reports it (`SO_SNDBUF`).
fn send_buffer(fd: RawFd) -> std::io::Result<usize> {
    Ok(usize::try_from(socket_option(fd, libc::SO_SNDBUF)?).unwrap_or(0))
}

/// An integer socket option at `SOL_SOCKET` level (`getsockopt`).
fn socket_option(fd: RawFd, name: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes and `len` says how large `value` is.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&raw mut value).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(value)
}

/// Says once per process when a local connection's send buffer came out narrower than
/// wanted (or could not be set): the connection is served either way, at more CPU per large
/// read, and the operator can lift the cap.
fn note_send_buffer(result: std::io::Result<SendBuffer>) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let wanted = 2 * UNIX_SEND_BUFFER_BYTES as usize;
    let problem = match result {
        Ok(buffer) if buffer.after >= wanted => return,
        Ok(buffer) => {
            let (after, before, wanted) = (buffer.after >> 10, buffer.before >> 10, wanted >> 10);
            format!("its send buffer is {after} KiB (from {before} KiB), not {wanted} KiB")
        }
        Err(error) => format!("its send buffer could not be set ({error})"),
    };
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    eprintln!(
        "sluice: warning: a local NBD connection is served, but {problem}, so large reads cost \
         more CPU; set the sysctl net.core.wmem_max to at least {} (a file in /etc/sysctl.d), \
         or give the server CAP_NET_ADMIN (said once)",
        UNIX_SEND_BUFFER_BYTES
    );
}

enum Stream {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Stream> {
    match listener {
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
    }
}

fn report(result: Result<(), crate::ConnectionError>) {
    if let Err(error) = result {
        eprintln!("sluice: NBD connection closed: {error}");
    }
}

/// [`report`] for a TCP client, naming its address.
fn report_from(result: Result<(), crate::ConnectionError>, peer: &str) {
    if let Err(error) = result {
        eprintln!("sluice: NBD connection from {peer} closed: {error}");
    }
}

/// Serves one client on stdin/stdout (libnbd's `nbd_connect_command`), until it leaves.
///
/// libnbd hands the server one end of a Unix socket pair as both stdin and stdout. That socket
/// is served on the reactor as an accepted local connection is (on this core: there is no
/// other connection to place it among), with vectored replies from the blocks' own buffers and
/// a wide send buffer. Tokio's stdin and stdout, which serve anything else (pipes, a
/// terminal), go through its blocking threads, one write of at most a block per hop: a 1 MiB
/// read's reply took 64 of them (docs/bench/peers-notes.md, 2026-12-07 06:09Z).
pub async fn serve_stdio(
    exports: Arc<dyn Exports>,
    tls: Option<Arc<TlsServer>>,
) -> Result<(), crate::ConnectionError> {
    let (_keep, shutdown) = watch::channel(false);
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    if let Some((socket, _restore)) = stdio_socket(stdin.as_fd(), stdout.as_fd()) {
        // Not said when capped: each client's launch is a new server, whose stderr is the
        // client's, and the warning would come with every one.
        let _ = widen_send_buffer(socket.as_raw_fd());
        return serve_placed(CoreStream::from(socket), exports, shutdown, tls, None).await;
    }
    let stream = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    serve_connection_tls(stream, exports, shutdown, tls).await
}

/// An open file's status flags as they were, put back when dropped: the reactor needs the
/// stdio socket non-blocking, and the flag belongs to the open file, which outlives the server
/// (in whatever else holds it: with libnbd, nothing does).
struct FileFlags<'a> {
    fd: BorrowedFd<'a>,
    flags: libc::c_int,
}

impl Drop for FileFlags<'_> {
    fn drop(&mut self) {
        // SAFETY: `fd` is open for the borrow's life; F_SETFL reads only its integer argument.
        unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, self.flags) };
    }
}

/// A non-blocking copy of `input` registered with the reactor, when `input` and `output` are
/// one Unix stream socket (`fstat`'s device and inode agree), and its flags to put back once
/// it is served. `None` for anything else, and where the copy cannot be made (said on
/// stderr): the caller serves those through tokio's stdin and stdout, a TCP socket from an
/// inetd-style launch among them.
fn stdio_socket<'a>(
    input: BorrowedFd<'a>,
    output: BorrowedFd<'_>,
) -> Option<(tokio::net::UnixStream, FileFlags<'a>)> {
    let (fd_in, fd_out) = (input.as_raw_fd(), output.as_raw_fd());
    if !is_unix_stream(fd_in) || !is_unix_stream(fd_out) {
        return None;
    }
    match (file_id(fd_in), file_id(fd_out)) {
        (Ok(a), Ok(b)) if a == b => {}
        _ => return None,
    }
    let warn = |error: std::io::Error| {
        eprintln!(
            "sluice: warning: stdin is a local socket, but it cannot be served directly \
             ({error}); serving it through stdin and stdout, at more CPU per request"
        );
    };
    // SAFETY: F_GETFL takes no argument and `fd_in` is open for the borrow's life.
    let flags = unsafe { libc::fcntl(fd_in, libc::F_GETFL) };
    if flags < 0 {
        // Nothing changed yet, and no flags to put back.
        warn(std::io::Error::last_os_error());
        return None;
    }
    let restore = FileFlags { fd: input, flags };
    // A descriptor of its own: the stream closes it when dropped, where closing stdin itself
    // would free its number for the next file opened.
    let stream =
        input.try_clone_to_owned().map(std::os::unix::net::UnixStream::from).and_then(|socket| {
            socket.set_nonblocking(true)?;
            tokio::net::UnixStream::from_std(socket)
        });
    match stream {
        Ok(stream) => Some((stream, restore)),
        Err(error) => {
            // `restore` puts the flags back as it drops, before tokio's stdin reads.
            warn(error);
            None
        }
    }
}

/// The (device, inode) `fstat` reports for `fd`.
fn file_id(fd: RawFd) -> std::io::Result<(libc::dev_t, libc::ino_t)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is valid for a write of a `struct stat`, which `fstat` fills on success.
    if unsafe { libc::fstat(fd, stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fstat` returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    Ok((stat.st_dev, stat.st_ino))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::widen_send_buffer;

    /// A local connection's send buffer ends up wider than the kernel gave it, with or
    /// without the privilege to pass over `net.core.wmem_max` (the kernel doubles what it is
    /// asked for, so a request capped at a `wmem_max` equal to the default still widens it;
    /// only a `wmem_max` under half the default, where the kernel can widen nothing without
    /// `CAP_NET_ADMIN`, would fail this), and is never narrowed.
    #[test]
    fn a_local_connections_send_buffer_is_widened() {
        let (server, client) = std::os::unix::net::UnixStream::pair().unwrap();
        let default = super::send_buffer(client.as_raw_fd()).unwrap();
        let widened = widen_send_buffer(server.as_raw_fd()).unwrap();
        assert_eq!(widened.before, default, "both ends start at the default");
        let wanted = 2 * super::UNIX_SEND_BUFFER_BYTES as usize;
        if default >= wanted {
            assert_eq!(widened.after, default, "a wide buffer is left as it is");
        } else {
            assert!(widened.after > default, "send buffer {widened:?}, the default {default}");
        }
        // Asked again, it is not narrowed.
        let again = widen_send_buffer(server.as_raw_fd()).unwrap();
        assert!(again.after >= widened.after.min(wanted), "{again:?} after {widened:?}");
    }

    /// `serve_stdio` serves stdin and stdout as one socket only where they are one Unix
    /// stream socket (libnbd's `nbd_connect_command`): not two ends of a pair, a pipe, a
    /// datagram socket, a TCP socket nor a file. The socket it serves is a non-blocking copy,
    /// and the original's flags are as they were once it is dropped.
    #[tokio::test]
    async fn only_one_unix_stream_socket_is_served_directly() {
        use std::os::fd::AsFd;

        let (server, client) = std::os::unix::net::UnixStream::pair().unwrap();
        let copy = server.try_clone().unwrap();
        let blocking = |fd: &dyn AsFd| {
            // SAFETY: F_GETFL takes no argument; the descriptor is open.
            let flags = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_GETFL) };
            assert!(flags >= 0);
            flags & libc::O_NONBLOCK == 0
        };
        assert!(blocking(&server));
        {
            let (socket, _restore) =
                super::stdio_socket(server.as_fd(), copy.as_fd()).expect("one socket twice");
            assert!(!blocking(&server), "the copy shares the open file, now non-blocking");
            // The copy is the same socket: what the client sends, it reads.
            std::io::Write::write_all(&mut &client, b"hello").unwrap();
            socket.readable().await.unwrap();
            let mut got = [0u8; 5];
            assert_eq!(socket.try_read(&mut got).unwrap(), 5);
            assert_eq!(&got, b"hello");
        }
        assert!(blocking(&server), "the flags are put back");
        assert!(super::stdio_socket(server.as_fd(), client.as_fd()).is_none(), "two ends");

        let mut pipe = [0 as libc::c_int; 2];
        // SAFETY: `pipe` has room for the two descriptors, which the OwnedFds then own.
        let [read, write] = unsafe {
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0, "{}", std::io::Error::last_os_error());
            pipe.map(|fd| <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
        };
        assert!(super::stdio_socket(read.as_fd(), write.as_fd()).is_none(), "a pipe");
        let (datagram, _other) = std::os::unix::net::UnixDatagram::pair().unwrap();
        assert!(super::stdio_socket(datagram.as_fd(), datagram.as_fd()).is_none(), "datagrams");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(super::stdio_socket(tcp.as_fd(), tcp.as_fd()).is_none(), "TCP");
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(super::stdio_socket(file.as_fd(), file.as_fd()).is_none(), "a file");
        assert!(blocking(&read) && blocking(&datagram), "nothing else was changed");
    }
}
