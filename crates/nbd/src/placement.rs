//! Which serving core a connection runs on, and how its socket moves there.
//!
//! A connection is accepted and haggled on a core chosen round robin. Once the client has
//! chosen its export, the connection moves to that volume's home core, so that every
//! connection to one volume runs on one thread: its writes to the volume's dirty blocks and
//! log, and the log's commit wake-ups, happen on one core, with no volume lock contended
//! between its connections and no committer woken on another core when a log group finishes
//! (the txg sync, on core 0, still takes the store's locks). Measured on a 2-core VM
//! (`bench/per-op.sh sluice syncwrite 8|32`, a one-file pool, two rounds each, 2026-11-25, a
//! build of the tree committed as 689865d against the binary of 593d715): with one volume's
//! connections spread round robin over both cores, 9,129-9,309 IOPS at 8
//! clients and 12,297-12,350 at 32, at 106-107 and 90-92 us of server CPU per write + flush;
//! with them on the volume's core, 12,142-12,712 and 15,464-16,420 IOPS at 82-85 and 69-72 us.
//! Spread, a connection's write waited on the other core's locks (`futex` waits in the volume's
//! write and the log's commit), and a finished log group woke committers on both cores.
//!
//! A volume's home is the core with the fewest connections already homed there, the last core
//! on a tie: core 0 also runs the txg syncs and the accept loops, whose CPU then goes beside
//! the volume's instead of in front of it. The home is kept while the volume has connections
//! and chosen afresh after its last one closes. Different volumes spread over the cores; one
//! volume's clients share one core, which caps what CPU-heavy requests to one volume get: 1 MiB
//! write + flush from 4 clients, whose blocks are compressed and checksummed as they arrive
//! (logged by pointer), reached 587 MB/s against 701 spread over both cores (`bench/peers.sh`,
//! 6 rounds, 2026-11-25, commit ab47718: docs/bench/peers-placement.md). The
//! `volume.placement=spread` tunable keeps each connection on the core it was accepted onto.
//!
//! Moving a socket: it leaves the first core's reactor (`Movable::detach`: tokio's
//! `into_std`), and the task that goes on serving it on the home core registers it with that
//! core's reactor (`Movable::attach`: `from_std`). A TLS session moves with its socket: the
//! TLS state is plain memory; only the socket underneath is registered.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use sluice_engine::Volume;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::runtime::Handle;

/// How connections are spread over the serving cores (the `volume.placement` tunable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Every connection to one volume on that volume's home core (the default).
    Home,
    /// Each connection on the core it was accepted onto, round robin, whatever it serves.
    Spread,
}

/// Where accepted connections run: the accepting runtime (no cores given), or one of several
/// single-threaded cores (thread-per-core serving).
#[derive(Clone, Debug)]
pub struct Placement {
    cores: Arc<Vec<Handle>>,
    policy: Policy,
    next: Arc<AtomicUsize>,
    /// By volume (`Volume::dataset_key`): its home core and the connections served there.
    homes: Arc<Mutex<Homes>>,
}

type Homes = HashMap<usize, (usize, usize)>;

impl Default for Placement {
    fn default() -> Placement {
        Placement::cores(Vec::new(), Policy::Home)
    }
}

impl Placement {
    /// Places connections on `cores` as `policy` says; an empty list keeps them on the
    /// accepting runtime.
    pub fn cores(cores: Vec<Handle>, policy: Policy) -> Placement {
        Placement { cores: Arc::new(cores), policy, next: Arc::default(), homes: Arc::default() }
    }

    /// The core a new connection is accepted onto, by index, round robin.
    pub(crate) fn next(&self) -> Option<(usize, &Handle)> {
        if self.cores.is_empty() {
            return None;
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.cores.len();
        Some((index, &self.cores[index]))
    }

    /// The home core of `volume` for one more connection, held until the returned [`Home`] is
    /// dropped; `None` when connections stay where they were accepted.
    pub(crate) fn home(&self, volume: &Volume) -> Option<Home> {
        if self.cores.len() < 2 || self.policy != Policy::Home {
            return None;
        }
        let key = volume.dataset_key();
        let mut homes = self.homes();
        let core = match homes.get_mut(&key) {
            Some((core, connections)) => {
                *connections += 1;
                *core
            }
            None => {
                let load = self.load(&homes);
                // Fewest connections; the last core on a tie (core 0 runs the txg syncs).
                let core = (0..load.len()).rev().min_by_key(|&c| load[c]).unwrap_or(0);
                homes.insert(key, (core, 1));
                core
            }
        };
        // The handle keeps the dataset, and so its key, from being reused while counted.
        Some(Home { placement: self.clone(), volume: volume.clone(), core })
    }

    /// Connections homed on each core, by core.
    fn load(&self, homes: &Homes) -> Vec<usize> {
        let mut load = vec![0usize; self.cores.len()];
        for &(core, connections) in homes.values() {
            load[core] += connections;
        }
        load
    }

    /// The homes table (a panic while it was held left it consistent: every change to it is
    /// one insert, update or removal).
    fn homes(&self) -> MutexGuard<'_, Homes> {
        self.homes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connections homed on each core, by core.
    #[cfg(test)]
    pub(crate) fn connections_by_core(&self) -> Vec<usize> {
        self.load(&self.homes())
    }
}

/// One connection's claim on its volume's home core.
#[derive(Debug)]
pub(crate) struct Home {
    placement: Placement,
    volume: Volume,
    pub(crate) core: usize,
}

impl Home {
    /// Asserts that the caller runs on the home core.
    pub(crate) fn assert_here(&self) {
        let home = self.placement.cores.get(self.core).map(Handle::id);
        let here = Handle::try_current().ok().map(|h| h.id());
        debug_assert_eq!(here, home, "a connection is served on its volume's home core");
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let mut homes = self.placement.homes();
        let key = self.volume.dataset_key();
        if let Some((_, connections)) = homes.get_mut(&key) {
            *connections -= 1;
            if *connections == 0 {
                homes.remove(&key);
            }
        }
    }
}

/// Where a connection runs now, and where it may move.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) placement: Placement,
    /// The core it was accepted onto.
    pub(crate) here: usize,
}

impl Placed {
    /// The connection's claim on `volume`'s home core, and that core's runtime if it must move
    /// there; `None` when it stays where it is, counted on no core.
    pub(crate) fn home(&self, volume: &Volume) -> Option<(Home, Option<Handle>)> {
        let home = self.placement.home(volume)?;
        let there = (home.core != self.here).then(|| self.placement.cores[home.core].clone());
        Some((home, there))
    }
}

/// A connection's stream that can leave one core's reactor and join another's.
pub(crate) trait Movable {
    /// Leaves the reactor it is registered with; no I/O until [`Movable::attach`].
    fn detach(&mut self) -> io::Result<()>;
    /// Registers with the reactor of the runtime it is called on.
    fn attach(&mut self) -> io::Result<()>;
    /// The socket's descriptor, where a payload may be received from it directly (a plain
    /// socket, attached): server.rs's `read_blocks` then takes a write's blocks in one
    /// vectored receive. `None` where the bytes must come through the stream: TLS decrypts
    /// them, and stdio on pipes and test pipes are not sockets.
    fn socket_fd(&self) -> Option<RawFd> {
        None
    }
}

impl<S: Movable> Movable for tokio_openssl::SslStream<S> {
    fn detach(&mut self) -> io::Result<()> {
        self.get_mut().detach()
    }

    fn attach(&mut self) -> io::Result<()> {
        self.get_mut().attach()
    }
}

/// An accepted socket that can move between cores.
#[derive(Debug)]
pub(crate) struct CoreStream(Socket);

#[derive(Debug)]
enum Socket {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
    DetachedUnix(std::os::unix::net::UnixStream),
    DetachedTcp(std::net::TcpStream),
    /// After a detach or attach that failed: the socket is closed.
    Gone,
}

impl From<tokio::net::UnixStream> for CoreStream {
    fn from(stream: tokio::net::UnixStream) -> CoreStream {
        CoreStream(Socket::Unix(stream))
    }
}

impl From<tokio::net::TcpStream> for CoreStream {
    fn from(stream: tokio::net::TcpStream) -> CoreStream {
        CoreStream(Socket::Tcp(stream))
    }
}

impl Movable for CoreStream {
    fn detach(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, Socket::Gone) {
            Socket::Unix(s) => Socket::DetachedUnix(s.into_std()?),
            Socket::Tcp(s) => Socket::DetachedTcp(s.into_std()?),
            detached => detached,
        };
        Ok(())
    }

    fn attach(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, Socket::Gone) {
            Socket::DetachedUnix(s) => Socket::Unix(tokio::net::UnixStream::from_std(s)?),
            Socket::DetachedTcp(s) => Socket::Tcp(tokio::net::TcpStream::from_std(s)?),
            attached => attached,
        };
        Ok(())
    }

    fn socket_fd(&self) -> Option<RawFd> {
        match &self.0 {
            Socket::Unix(s) => Some(s.as_raw_fd()),
            Socket::Tcp(s) => Some(s.as_raw_fd()),
            _ => None,
        }
    }
}

fn between_cores() -> io::Error {
    io::Error::other("the connection's socket is between serving cores")
}

impl AsyncRead for CoreStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            _ => Poll::Ready(Err(between_cores())),
        }
    }
}

impl AsyncWrite for CoreStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            _ => Poll::Ready(Err(between_cores())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            Socket::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Socket::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            _ => Poll::Ready(Err(between_cores())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            _ => Poll::Ready(Err(between_cores())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            _ => Poll::Ready(Err(between_cores())),
        }
    }
}

/// A stream that stays where it is (stdio on pipes, test pipes): never asked to move, since only
/// connections given a [`Placed`] are.
#[derive(Debug)]
pub(crate) struct Fixed<S>(pub(crate) S);

impl<S> Movable for Fixed<S> {
    fn detach(&mut self) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this stream cannot move between cores"))
    }

    fn attach(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Fixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Fixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    use super::*;
    use crate::listen::{serve, Listener};
    use crate::proto::{self, Request};
    use crate::server::Exports;
    use crate::testing::{
        go_to, hello, option, option_replies, psk_handshake, request, store_in, tls, ByName,
        Client, KEY,
    };

    /// Every connection to one volume ends on that volume's core, another volume's on the
    /// other core; connections that moved (one of them inside TLS) are served there (each
    /// asserts it runs on its home core's runtime as its transmission starts: a failed
    /// assertion closes the connection, and its request here fails); and the homes are given
    /// back as the connections close.
    #[test]
    fn a_volumes_connections_share_its_home_core() {
        let cores = sluice_host::Cores::start(2).unwrap();
        let env = cores.env(5);
        let placement = Placement::cores(cores.handles().to_vec(), Policy::Home);
        let dir = tempfile::tempdir().unwrap();
        let tls = tls(dir.path(), false);
        let path = dir.path().join("nbd.sock");
        let store = cores.block_on(async {
            let store = store_in(&env).await;
            store.create_volume("vol1", 16 << 20, 4096).unwrap();
            let listener = Listener::Unix(tokio::net::UnixListener::bind(&path).unwrap());
            let (stop, shutdown) = tokio::sync::watch::channel(false);
            let exports: Arc<dyn Exports> = Arc::new(ByName(Arc::clone(&store)));
            let server = serve(vec![listener], exports, shutdown, placement.clone(), Some(tls));
            let server = tokio::spawn(server);
            // Accepted round robin onto cores 0, 1, 0, 1; vol0 is homed first, on the last
            // core (core 0 runs the txg syncs), vol1 on core 0: the first three move.
            let mut clients: Vec<Box<dyn Client + Send>> = Vec::new();
            for (i, name) in ["vol0", "vol1", "vol0", "vol0"].into_iter().enumerate() {
                let mut client = UnixStream::connect(&path).await.unwrap();
                hello(&mut client).await;
                let mut client: Box<dyn Client + Send> = if i == 2 {
                    option(&mut client, proto::OPT_STARTTLS, &[]).await;
                    option_replies(&mut client).await;
                    Box::new(psk_handshake(client, "alice", KEY).await.unwrap())
                } else {
                    Box::new(client)
                };
                go_to(&mut client, name).await;
                // A request answered means the connection has taken its place.
                let offset = i as u64 * 4096;
                let write =
                    Request { flags: 0, kind: proto::CMD_WRITE, cookie: 1, offset, len: 4096 };
                assert_eq!(request(&mut client, write, &[i as u8 + 1; 4096]).await, 0);
                clients.push(client);
            }
            assert_eq!(placement.connections_by_core(), vec![1, 3]);
            // Requests go on being served after the moves.
            for (i, client) in clients.iter_mut().enumerate() {
                let flush =
                    Request { flags: 0, kind: proto::CMD_FLUSH, cookie: 2, offset: 0, len: 0 };
                assert_eq!(request(client, flush, &[]).await, 0, "connection {i}");
                let disc =
                    Request { flags: 0, kind: proto::CMD_DISC, cookie: 3, offset: 0, len: 0 };
                client.write_all(&disc.encode()).await.unwrap();
            }
            drop(clients);
            stop.send(true).unwrap();
            server.await.unwrap();
            assert_eq!(placement.connections_by_core(), vec![0, 0]);
            store
        });
        let read = |name: &str, offset: u64| {
            let volume = Volume::open(&store, name).unwrap();
            cores.block_on(async move { volume.read(offset, 4096).await.unwrap() })
        };
        assert_eq!(read("vol0", 0), vec![1u8; 4096]);
        assert_eq!(read("vol1", 4096), vec![2u8; 4096]);
        assert_eq!(read("vol0", 8192), vec![3u8; 4096]);
        assert_eq!(read("vol0", 12288), vec![4u8; 4096]);
    }
}
