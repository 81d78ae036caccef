//! Where connections come from, and a clean stop.
//!
//! Each accepted connection runs as its own task. On shutdown the listeners stop accepting,
//! every connection stops reading new requests, answers those it has, and closes; the caller
//! then syncs and exports the pool.

use std::os::fd::{FromRawFd, RawFd};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::server::{serve_connection, Exports};

/// A listening socket of either family.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Adopts an inherited listening socket (already bound and listening).
    ///
    /// # Safety
    /// `fd` must be an open listening socket that nothing else in the process owns.
    pub unsafe fn from_fd(fd: RawFd) -> std::io::Result<Listener> {
        // SAFETY: the caller hands over ownership of an open socket.
        let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_storage is plain old data; all zeros is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        use std::os::fd::AsRawFd;
        // SAFETY: storage is large enough for any address, len says how large.
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

/// Listening sockets passed by systemd-style socket activation (`LISTEN_PID` is this process,
/// `LISTEN_FDS` counts them from fd 3). Takes them: the variables are removed.
pub fn inherited() -> std::io::Result<Vec<Listener>> {
    let pid_matches = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<i32>().ok());
    let (true, Some(count)) = (pid_matches, count) else { return Ok(Vec::new()) };
    // SAFETY: single-threaded at this point in startup is the caller's duty; removing the
    // variables keeps children from adopting the same sockets.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    (0..count.clamp(0, 64))
        // SAFETY: socket activation hands these fds to this process.
        .map(|i| unsafe { Listener::from_fd(3 + i) })
        .collect()
}

/// Accepts connections on every listener until `shutdown` turns true, then waits for the open
/// connections to finish their requests.
pub async fn serve(
    listeners: Vec<Listener>,
    exports: Arc<dyn Exports>,
    shutdown: watch::Receiver<bool>,
) {
    let mut acceptors = JoinSet::new();
    for listener in listeners {
        let (exports, shutdown) = (Arc::clone(&exports), shutdown.clone());
        acceptors.spawn(accept_loop(listener, exports, shutdown));
    }
    while acceptors.join_next().await.is_some() {}
}

async fn accept_loop(
    listener: Listener,
    exports: Arc<dyn Exports>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = accept(&listener) => accepted,
        };
        match accepted {
            Ok(Stream::Unix(stream)) => {
                let (exports, shutdown) = (Arc::clone(&exports), shutdown.clone());
                connections.spawn(async move {
                    report(serve_connection(stream, exports, shutdown).await)
                });
            }
            Ok(Stream::Tcp(stream)) => {
                // Replies are small and latency matters more than packing them.
                let _ = stream.set_nodelay(true);
                let (exports, shutdown) = (Arc::clone(&exports), shutdown.clone());
                connections.spawn(async move {
                    report(serve_connection(stream, exports, shutdown).await)
                });
            }
            // A failed accept (a client gone before we took it, fd pressure) ends no one else.
            Err(error) => eprintln!("sluice: accepting a connection: {error}"),
        }
        // Reap finished connections as we go.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
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

/// Serves one client on stdin/stdout (libnbd's `nbd_connect_command`), until it leaves.
pub async fn serve_stdio(exports: Arc<dyn Exports>) -> Result<(), crate::ConnectionError> {
    let stream = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    let (_keep, shutdown) = watch::channel(false);
    serve_connection(stream, exports, shutdown).await
}
