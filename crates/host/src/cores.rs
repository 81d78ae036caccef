//! Thread-per-core serving: one single-threaded event loop per core, each owning an io_uring.
//!
//! Each core is a tokio current-thread runtime on a thread of its own (the first one on the
//! caller's thread). A connection is accepted onto one core and, once it has chosen its export,
//! moves once to its volume's core (sluice_nbd's placement.rs), which then reads its requests,
//! runs the engine's write and log append, submits the device commands to its own ring
//! (`sluice_engine::core_ring`), reaps their completions and sends the replies. Tasks the
//! engine spawns from a core stay on that core, so a request, its device commands and its reply
//! never change thread; only work that is shared by nature crosses cores (the txg sync, and
//! with `volume.placement=spread` a commit that waits for a log block another core's connection
//! is writing), and the engine's hand-offs to the other cores (`Spawn::spawn_elsewhere`: a large
//! write's compression and checksums, and the early fill of a large write's parts, whose device
//! writes go through that core's ring).
//!
//! Why tokio current-thread runtimes and not a thread-per-core runtime crate (glommio, monoio,
//! compio, tokio-uring): the engine and the NBD server are written against tokio's sockets,
//! timers and sync primitives, and keep working unchanged; the one thing the loop needs that
//! tokio lacks, a ring it owns, is the engine's `core_ring`, driven from here by a task that
//! waits on the ring's descriptor. glommio and tokio-uring are unmaintained, monoio lacks linked
//! operations, and compio's 0.x API breaks often (docs/design.md, "Runtime model"). The cost is
//! one `epoll_wait` and one `io_uring_enter` per loop turn instead of one combined wait.
//!
//! A polling core about to sleep first polls its loop's descriptors for a short, adaptive while
//! (crate::idle_poll, `cores.idle_poll_us`): on a VM, waking an idle core costs more than a
//! lone client's gaps between requests. Every core, polling or not, also reaps its ring's
//! completions itself as it is about to sleep, ahead of the reaper task.

use std::future::Future;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sluice_engine::core_ring;
use sluice_engine::rt::{BoxFuture, Env, Spawn};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::oneshot;

use crate::idle_poll::IdlePoll;

/// The serving cores. Dropping it stops the other cores' threads.
#[derive(Debug)]
pub struct Cores {
    /// Core 0's runtime; its loop runs on the thread that calls [`Cores::block_on`].
    first: Runtime,
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Cores {
    /// Starts `count` cores (at least one), which reap their rings and sleep at once when idle.
    /// Core 0 runs when [`Cores::block_on`] is called.
    pub fn start(count: usize) -> io::Result<Cores> {
        Cores::start_polling(count, Duration::ZERO)
    }

    /// [`Cores::start`], each core but core 0 (unless it is the only one) polling for up to
    /// `idle_poll` (at most 10 ms) before it sleeps (`cores.idle_poll_us`; crate::idle_poll).
    pub fn start_polling(count: usize, idle_poll: Duration) -> io::Result<Cores> {
        let count = count.max(1);
        // The tunable's bound: a core never polls longer than this before it sleeps.
        let idle_poll = idle_poll.min(Duration::from_millis(10));
        // Core 0 runs the txg syncs and the accept loops, and volumes are homed away from it
        // while other cores have fewer connections: its wake-ups seldom carry a client's
        // request, and polling there took the CPU from the clients' own threads (32 clients
        // of 4 KiB write + flush on two cores: 0.91x the writes with it, 1.07x without). It
        // polls only as the one core.
        let first_poll = if count == 1 { idle_poll } else { Duration::ZERO };
        let first = current_thread("sluice_core/0", first_poll)?;
        let mut handles = vec![first.handle().clone()];
        let (mut stops, mut threads) = (Vec::new(), Vec::new());
        for index in 1..count {
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let (stop, stopped) = oneshot::channel::<()>();
            let name = format!("sluice_core/{index}");
            let thread = thread::Builder::new().name(name.clone()).spawn(move || {
                let runtime = match current_thread(&name, idle_poll) {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(runtime.handle().clone()));
                runtime.block_on(async move {
                    let reaper = start_ring();
                    let _ = stopped.await;
                    if let Some(reaper) = reaper {
                        reaper.abort();
                        core_ring::stop_submitter();
                    }
                });
                drop(runtime);
                core_ring::uninstall();
            })?;
            let handle = handle_rx.recv().map_err(|_| io::Error::other("core thread died"))??;
            handles.push(handle);
            stops.push(stop);
            threads.push(thread);
        }
        Ok(Cores { first, handles, stops, threads })
    }

    /// Runs `task` on core 0, on this thread, with core 0's ring installed.
    pub fn block_on<F: Future>(&self, task: F) -> F::Output {
        self.first.block_on(async move {
            let reaper = start_ring();
            let output = task.await;
            if let Some(reaper) = reaper {
                // Aborted tasks are dropped only when the loop runs again: until then pushes
                // on this thread must not wait for a submitter that is not polled.
                reaper.abort();
                core_ring::stop_submitter();
            }
            output
        })
    }

    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// An engine environment whose tasks run on the core that spawns them (core 0 when spawned
    /// from elsewhere).
    pub fn env(&self, seed: u64) -> Env {
        Env::new(
            Arc::new(crate::TokioClock::default()),
            Arc::new(CoreSpawn { handles: self.handles.clone(), next: AtomicUsize::new(0) }),
            seed,
        )
        .with_memory_bytes(sluice_engine::rt::machine_memory_bytes())
    }
}

impl Drop for Cores {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        core_ring::uninstall();
    }
}

/// A core's loop; about to sleep, it reaps its ring, and with a nonzero `idle_poll` it polls
/// its descriptors for up to that long first (crate::idle_poll). The cores are built one at a
/// time, so the `epoll` descriptors that appear while one is built are its own.
fn current_thread(name: &str, idle_poll: Duration) -> io::Result<Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().thread_name(name);
    // With no window the hook only reaps the ring before the loop sleeps (core 0 beside other
    // cores, `cores.idle_poll_us=0`).
    let poll = Arc::new(IdlePoll::new(idle_poll));
    let (parking, waking) = (Arc::clone(&poll), Arc::clone(&poll));
    builder
        .on_thread_park(move || parking.before_park())
        .on_thread_unpark(move || waking.after_unpark());
    if idle_poll.is_zero() {
        // Nothing to watch: a loop that never polls needs no descriptors.
        return builder.build();
    }
    let before = IdlePoll::epoll_fds();
    let runtime = builder.build()?;
    poll.watch(&before, &IdlePoll::epoll_fds());
    Ok(runtime)
}

/// Spawns onto the core the caller runs on: a task and whatever it spawns share a thread.
/// Work spawned elsewhere goes to the other cores in turn.
#[derive(Debug)]
struct CoreSpawn {
    /// Every core's runtime; the first is also where tasks spawned from outside any core go.
    handles: Vec<Handle>,
    /// Turns of [`Spawn::spawn_elsewhere`] so far.
    next: AtomicUsize,
}

impl Spawn for CoreSpawn {
    fn spawn(&self, _name: &'static str, task: BoxFuture<()>) {
        match Handle::try_current() {
            Ok(handle) => drop(handle.spawn(task)),
            Err(_) => drop(self.handles[0].spawn(task)),
        }
    }

    fn spawn_elsewhere(&self, name: &'static str, task: BoxFuture<()>) {
        let here = Handle::try_current().ok().map(|h| h.id());
        let others: usize = self.handles.iter().filter(|h| Some(h.id()) != here).count();
        if others == 0 {
            return self.spawn(name, task);
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % others;
        let handle = self.handles.iter().filter(|h| Some(h.id()) != here).nth(turn);
        drop(handle.expect("turn is below the count of other cores").spawn(task));
    }

    fn parallelism(&self) -> usize {
        self.handles.len()
    }

    fn shares_thread(&self) -> bool {
        true
    }

    fn yield_now(&self) -> BoxFuture<()> {
        Box::pin(async {
            // The ring's completions that wait for this thread to enter the kernel (it runs
            // them cooperatively, `core_ring::install`): the loop's look at its reactor below
            // comes before the kernel posts them, and would leave them to the next pause.
            crate::idle_poll::reap_ring();
            // Past the loop's poll of its sockets and of the ring's descriptor: a socket's
            // task and the ring's reaper run first.
            tokio::task::yield_now().await;
            // Behind the tasks the reaper's completions woke, which it queued after this one.
            sluice_engine::rt::yield_now().await;
        })
    }
}

/// Installs this core's ring and starts the task that reaps it; `None` where io_uring is
/// refused (the devices then use their own threads).
fn start_ring() -> Option<tokio::task::JoinHandle<()>> {
    let fd = core_ring::install().ok()?;
    let reaper = reaper(fd);
    if reaper.is_none() {
        // A ring nobody reaps would leave every operation pushed to it waiting forever.
        core_ring::uninstall();
    }
    reaper
}

/// Starts the task that reaps the ring whose descriptor is `fd`, and the submitter beside it.
fn reaper(fd: std::os::fd::RawFd) -> Option<tokio::task::JoinHandle<()>> {
    // A duplicate the reaper owns: readiness is the ring's, and the descriptor stays open for
    // as long as the reactor watches it, whenever the ring itself is removed.
    // SAFETY: `fd` is the ring's open descriptor; dup only reads it.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return None;
    }
    // SAFETY: `dup` was just returned by F_DUPFD_CLOEXEC, so it is open and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the OwnedFd is open and owned by the AsyncFd for its whole life, so the
    // descriptor it reports stays the same open file description.
    let ring = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }.ok()?;
    Some(tokio::spawn(async move {
        // Submits each turn's entries together (core_ring's module doc); aborted with the
        // reaper (whose owner also stops it at once, core_ring::stop_submitter).
        let submitter = tokio::spawn(core_ring::submitter());
        let _stop = AbortOnDrop(submitter);
        loop {
            let Ok(mut ready) = ring.readable().await else { return };
            core_ring::reap();
            ready.clear_ready();
            // Completions that arrived between the reap and clearing readiness raised no new
            // edge; reaping again after clearing leaves none behind.
            core_ring::reap();
        }
    }))
}

/// Aborts a task when dropped: the submitter stops with the reaper that started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks spawned through a core's environment run on that core's thread.
    #[test]
    fn spawned_tasks_stay_on_their_core() {
        let cores = Cores::start(2).unwrap();
        let env = cores.env(1);
        let handle = cores.handles()[1].clone();
        let same = cores.block_on(async move {
            handle
                .spawn(async move {
                    let here = thread::current().id();
                    let (tx, rx) = oneshot::channel();
                    env.spawn("test", async move {
                        let _ = tx.send(thread::current().id());
                    });
                    rx.await.unwrap() == here
                })
                .await
                .unwrap()
        });
        assert!(same);
    }

    /// A loop that never polls (core 0 beside other cores) reaps its ring itself before it
    /// sleeps: with no reaper task, an operation whose completion waits in the ring finishes
    /// (without the hook the loop would sleep until the timeout).
    #[test]
    fn a_loop_that_never_polls_reaps_its_ring_before_it_sleeps() {
        use std::io::Write;
        let runtime = current_thread("sluice_core/test", Duration::ZERO).unwrap();
        let read = runtime.block_on(async {
            // Where io_uring is refused there is no ring to reap.
            let Ok(_ring) = core_ring::install() else { return None };
            let (mut near, far) = std::os::unix::net::UnixStream::pair().unwrap();
            let op = core_ring::read_stream(far, 1).expect("a ring is installed");
            near.write_all(b"x").unwrap();
            assert!(core_ring::has_completions(), "posted before the loop parks");
            let read = tokio::time::timeout(Duration::from_secs(20), op).await;
            core_ring::uninstall();
            Some(read)
        });
        if let Some(read) = read {
            assert_eq!(read.expect("reaped before the loop slept"), 1);
        }
    }

    /// Long work on a core: computes until a pause is due, then pauses, until `done` is set
    /// (or a thousand pauses pass). Returns the pauses taken.
    async fn work_with_pauses(env: Env, done: Arc<std::sync::atomic::AtomicBool>) -> u32 {
        let mut pauses = 0u32;
        while !done.load(Ordering::Relaxed) && pauses < 1000 {
            let since = env.now().as_nanos();
            while env.now().as_nanos() - since < sluice_engine::rt::PAUSE_AFTER_NANOS {
                std::hint::spin_loop();
            }
            env.pause().await;
            pauses += 1;
        }
        pauses
    }

    /// A pause in long work on a core lets the core's loop look at its sockets first: a task
    /// waiting on a socket that has bytes runs at the first pause that yields. (A task merely
    /// woken again would have gone back in the run queue, and the loop would have looked only
    /// after dozens of turns.)
    #[test]
    fn a_pause_lets_a_waiting_socket_in() {
        use std::sync::atomic::AtomicBool;
        let cores = Cores::start(1).unwrap();
        let env = cores.env(1);
        let pauses = cores.block_on(async move {
            let (mut near, far) = tokio::net::UnixStream::pair().unwrap();
            let read = Arc::new(AtomicBool::new(false));
            let (started, waiting) = oneshot::channel();
            let reader = {
                let read = Arc::clone(&read);
                tokio::spawn(async move {
                    let _ = started.send(());
                    let mut byte = [0u8; 1];
                    tokio::io::AsyncReadExt::read_exact(&mut near, &mut byte).await.unwrap();
                    read.store(true, Ordering::Relaxed);
                })
            };
            waiting.await.unwrap();
            // The reader waits on its socket; the byte arrives before the long work starts.
            far.try_write(&[1]).unwrap();
            // The long work is a task of the core, as a txg sync is.
            let pauses = tokio::spawn(work_with_pauses(env, read)).await.unwrap();
            reader.await.unwrap();
            pauses
        });
        // The first pause starts the thread's stretch; the second yields.
        assert_eq!(pauses, 2, "the reader ran after {pauses} pauses");
    }

    /// A task of this core waiting on a ring read of one byte from `far`, started (its read
    /// is pending) when this returns; the flag says when it got the byte. `None` where io_uring
    /// is refused.
    async fn ring_reader(
        far: std::os::unix::net::UnixStream,
    ) -> Option<(tokio::task::JoinHandle<()>, Arc<std::sync::atomic::AtomicBool>)> {
        let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (started, waiting) = oneshot::channel();
        let op = core_ring::read_stream(far, 1)?;
        let reader = {
            let read = Arc::clone(&read);
            tokio::spawn(async move {
                let _ = started.send(());
                assert_eq!(op.await, 1, "the ring read the byte sent");
                read.store(true, Ordering::Release);
            })
        };
        waiting.await.unwrap();
        Some((reader, read))
    }

    /// A pause lets the core's ring in as it lets a socket in: a task waiting on a ring
    /// operation whose completion has arrived runs at the first pause that yields, so a txg
    /// sync's long stretch on a core does not hold back the log blocks, flushes and reads that
    /// completed on that core's ring. The completion takes one step more than a socket's
    /// bytes (the reaper, woken by the ring's descriptor, reaps it and wakes the waiting
    /// task), which is why a pause yields twice (`CoreSpawn::yield_now`): with tokio's yield
    /// alone the reader would run at the third pause.
    #[test]
    fn a_pause_lets_a_ring_completion_in() {
        use std::io::Write;
        let cores = Cores::start(1).unwrap();
        let env = cores.env(1);
        let pauses = cores.block_on(async move {
            let (mut near, far) = std::os::unix::net::UnixStream::pair().unwrap();
            // None where io_uring is refused: the device paths cover such a thread.
            let (reader, read) = ring_reader(far).await?;
            // The reader waits on the ring. Its read completes before the long work starts:
            // the write wakes the kernel's poll on the socket, and with no deferred task work
            // (the ring is not built DEFER_TASKRUN) the kernel posts the completion as this
            // thread leaves the write.
            near.write_all(&[1]).unwrap();
            let pauses = tokio::spawn(work_with_pauses(env, read)).await.unwrap();
            // A reader the ring never answered would hang the test: it fails instead.
            let answered = tokio::time::timeout(Duration::from_secs(20), reader).await;
            answered.expect("the ring answered the read").expect("the reader got its byte");
            Some(pauses)
        });
        let Some(pauses) = pauses else { return };
        // As for a socket: the first pause starts the thread's stretch; the second yields.
        assert_eq!(pauses, 2, "the ring's reader ran after {pauses} pauses");
    }

    /// A ring completion that arrives while a core computes (another thread's write, in the
    /// middle of a long task's stretch) is let in at the next pause too. The ring runs its
    /// completions cooperatively, so the kernel posts this one only when the core's thread next
    /// enters it; the pause reaps the ring first, which enters the kernel for it. Without that
    /// the loop's look at its reactor inside the pause would come before the completion was
    /// posted, and the reader would wait for a later pause (unless a timer interrupt on the
    /// core's CPU happened to post it).
    #[test]
    fn a_pause_lets_in_a_ring_completion_that_arrived_during_the_stretch() {
        use std::io::Write;
        use std::sync::atomic::AtomicBool;
        let cores = Cores::start(1).unwrap();
        let env = cores.env(1);
        let read_at_first_yield = cores.block_on(async move {
            let (near, far) = std::os::unix::net::UnixStream::pair().unwrap();
            // None where io_uring is refused: the device paths cover such a thread.
            let (reader, read) = ring_reader(far).await?;
            let go = Arc::new(AtomicBool::new(false));
            let written = Arc::new(AtomicBool::new(false));
            let writer = {
                let (go, written) = (Arc::clone(&go), Arc::clone(&written));
                std::thread::spawn(move || {
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    (&near).write_all(&[1]).unwrap();
                    written.store(true, Ordering::Release);
                    near
                })
            };
            // The long work, a task of the core as a txg sync is: no system call between the
            // first pause (which starts the stretch) and the second (which yields).
            let work = tokio::spawn(async move {
                env.pause().await;
                go.store(true, Ordering::Release);
                while !written.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let since = env.now().as_nanos();
                while env.now().as_nanos() - since < sluice_engine::rt::PAUSE_AFTER_NANOS {
                    std::hint::spin_loop();
                }
                env.pause().await;
                read.load(Ordering::Acquire)
            });
            let read_at_first_yield = work.await.unwrap();
            // A reader the ring never answered would hang the test: it fails instead.
            let answered = tokio::time::timeout(Duration::from_secs(20), reader).await;
            answered.expect("the ring answered the read").expect("the reader got its byte");
            drop(writer.join().unwrap());
            Some(read_at_first_yield)
        });
        let Some(read_at_first_yield) = read_at_first_yield else { return };
        assert!(read_at_first_yield, "the ring's reader ran at the first pause that yields");
    }

    /// Work spawned elsewhere from a core runs on each of the other cores in turn, never on
    /// the caller's; map_spread on a core answers in order with shares computed elsewhere.
    #[test]
    fn work_spawned_elsewhere_leaves_the_core() {
        use std::sync::Barrier;
        let cores = Cores::start(3).unwrap();
        let env = cores.env(1);
        let ids: Vec<_> = cores.handles().iter().map(|h| h.id()).collect();
        let handle = cores.handles()[1].clone();
        let (here, ran, spread) = cores.block_on(async move {
            handle
                .spawn(async move {
                    let mut ran = Vec::new();
                    for _ in 0..4 {
                        let (tx, rx) = oneshot::channel();
                        env.spawn_elsewhere("test", async move {
                            let _ = tx.send(Handle::current().id());
                        });
                        ran.push(rx.await.unwrap());
                    }
                    // Items 0, 2 and 4 each wait until all three are taken: no thread can
                    // take two of them, so each core takes one.
                    let met: &'static Barrier = Box::leak(Box::new(Barrier::new(3)));
                    let item = move |i: &u64| {
                        if i % 2 == 0 {
                            met.wait();
                        }
                        (*i, Handle::current().id())
                    };
                    let spread = env.map_spread("test", (0..6).collect(), item).await;
                    (Handle::current().id(), ran, spread)
                })
                .await
                .unwrap()
        });
        assert_eq!(here, ids[1]);
        assert_eq!(ran, [ids[0], ids[2], ids[0], ids[2]], "the other cores take turns");
        assert_eq!(spread.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        let mut takers: Vec<_> = [0, 2, 4].iter().map(|&i| spread[i].1).collect();
        takers.sort_by_key(|id| ids.iter().position(|c| c == id));
        assert_eq!(takers, ids, "the caller and both other cores took items: {spread:?}");
    }
}
