//! A serving core's idle polling: before its loop sleeps in `epoll_wait`, it watches its own
//! descriptors for a short while, so that a request or a completion arriving meanwhile is taken
//! at once instead of through a wake-up (Seastar's reactor polls before it sleeps for the same
//! reason; SPDK never sleeps).
//!
//! Why: on a VM an idle vCPU halts, and waking it costs an interrupt sent to it, a VM exit and
//! entry, and the scheduler's switch back to the loop: about 27 us on this project's VMs
//! (docs/bench/peers-notes.md, 2026-11-23), paid two or three times by every durable 4 KiB
//! write at queue depth 1 (its request, the log block's completion, the flush). Linux's own
//! answer, the guest halt-polling governor, is off on those VMs (`guest_halt_poll_ns=0`), and
//! a server cannot count on the host's settings.
//!
//! The window adapts as that governor's does (`drivers/cpuidle/governors/haltpoll.c`): it
//! starts at an eighth of the most (`cores.idle_poll_us`), doubles whenever the loop gave up
//! and its next event came within the most anyway, and halves, down to none, after a sleep
//! longer than that. So a core whose events come close together (a lone client's sync writes)
//! polls through its gaps, and one that waits milliseconds (a device busy with 1 MiB writes, an
//! idle server) soon sleeps at once again, without the CPU a fixed window would burn.
//!
//! While it polls the core gives its CPU away each turn (`sched_yield`): on a machine shared
//! with the clients, a thread waiting for this CPU runs first. A yield that ran another thread
//! ends the poll and closes the window: the CPU is wanted, and on a saturated machine (32
//! clients on two cores) polling cost a tenth of the operations.
//!
//! The descriptors: tokio does not expose its event loop's `epoll` descriptor, so the runtime's
//! are the `epoll` descriptors that appeared in `/proc/self/fd` while it was built (the cores
//! are built one at a time; a descriptor another thread opened meanwhile would be watched too,
//! and could only end polls early); readable, they have an event ready. If none is found the
//! core sleeps at once, as before. Timers are not descriptors: the earliest deadline an engine
//! sleep set on this thread ([`note_deadline`], from `TokioClock`) ends the poll, and a later
//! one among several may fire up to one window late, as may tokio's own timers (the NBD
//! server's handshake and key checks: seconds, to which a window is nothing). A deadline is
//! noted on the thread that makes the sleep, which for the engine's tasks is the one that
//! awaits it (they stay on their core).
//!
//! Before it polls (also when it then sleeps at once: its requests are large, or its window has
//! closed), and at each turn of a poll, the loop reaps its core ring's completions itself
//! (`core_ring`, whose completion queue it reads without a system call, entering the kernel
//! only for completions the ring says wait for that). Otherwise the poll would
//! end on the ring's descriptor, the loop would ask its reactor, and the ring's reaper task would
//! reap them: a poll turn, an `epoll_wait` that returns the descriptor and a task's turn more
//! between a log block's durable write and the flush reply waiting for it. The woken tasks are
//! queued, so tokio does not block (it still asks its reactor once, without waiting: tokio 1.51.4
//! and later, tokio#8222, which is why the workspace asks for a tokio past that); and as the
//! reactor looks at the ring's descriptor again before it reports it, an emptied ring wakes no
//! reaper. A core that never polls (`cores.idle_poll_us=0`, and core 0 beside other cores) reaps
//! so too and then sleeps at once: core 0's completions are mostly the txg sync's writes and
//! the early fills of large writes' parts.
//!
//! A core whose recent reads and writes are large sleeps at once, leaving its window as it was
//! (the moving mean of their bytes, which the NBD server notes through
//! `sluice_engine::rt::note_request` on the core that serves them; [`LARGE_REQUEST_BYTES`]).
//! A durable 1 MiB write takes a millisecond or more, so a wake-up's tens of microseconds are
//! a few percent of it; but its receive, its device writes and its flush leave gaps shorter
//! than the window, which kept the window open. Polling through them cost a lone client's
//! 1 MiB write + flush a sixth more server CPU a MiB for a sixteenth more MiB/s (without it
//! the write's reply waits for wake-ups again: its median nearly doubles); four clients', a
//! stream's and uncached 1 MiB reads gained nothing by it (docs/bench/design-figures.md,
//! Runtime model). Polling
//! in some of a large-request core's waits and not in others (only while its ring is empty,
//! only while it holds operations, or while a payload arrives) did no better in trials
//! (docs/bench/peers-notes.md, 2026-12-06 21:14Z). Each request weighs the same in the mean,
//! so a core whose requests are mostly a stream's counts as large, while small requests
//! several to one beside it keep the poll.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_engine::core_ring;

/// A `sched_yield` that took longer than this ran another thread: the CPU is contended.
const CONTENDED_YIELD_NS: u64 = 10_000;

/// A core whose reads and writes average this many bytes or more (the moving mean of
/// `sluice_engine::rt::request_bytes_mean`) sleeps at once: its requests take long enough
/// that a wake-up is a small part of each, and polling through their gaps buys little for
/// the CPU it burns. A quarter MiB: the 64 KiB to 128 KiB requests of a filesystem's writeback
/// and readahead still poll.
const LARGE_REQUEST_BYTES: u64 = 256 * 1024;

thread_local! {
    /// The earliest deadline an engine sleep set on this thread that has not yet passed.
    static NEXT_DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Whether this thread's recent reads and writes are large ([`LARGE_REQUEST_BYTES`]): a
/// 1 MiB stream's requests turn the mean large on the third, and after it small ones bring
/// it back under on their eleventh (more after larger requests).
fn requests_are_large() -> bool {
    sluice_engine::rt::request_bytes_mean() >= LARGE_REQUEST_BYTES
}

/// Reaps this core's ring ([`core_ring::reap`]) if completions wait in it, and says whether
/// that woke a future: woken onto this loop's queue, it runs instead of the loop sleeping
/// (tokio's current-thread loop blocks only with an empty queue). Completions whose futures
/// are gone wake nothing, and the loop goes on to poll or sleep.
pub(crate) fn reap_ring() -> bool {
    core_ring::has_completions() && core_ring::reap() > 0
}

/// Records that a task on this thread sleeps until `at`: a poll must not hold the loop past it.
pub(crate) fn note_deadline(at: Instant) {
    NEXT_DEADLINE.with(|next| {
        let now = Instant::now();
        let earliest = match next.get() {
            Some(known) if known > now => known.min(at),
            _ => at,
        };
        next.set(Some(earliest));
    });
}

/// One core's idle polling: its window and its loop's descriptors.
#[derive(Debug)]
pub(crate) struct IdlePoll {
    /// The longest window (`cores.idle_poll_us`); zero never polls, only reaps.
    most_ns: u64,
    /// The window the next idle turn polls for.
    window_ns: AtomicU64,
    /// When the last poll gave up and the loop went to sleep (ns after `epoch`); zero when
    /// the poll found an event, so the wake-up that follows is not a sleep's.
    slept_at_ns: AtomicU64,
    epoch: Instant,
    /// The runtime's `epoll` descriptors, known once it is built.
    fds: Mutex<Vec<RawFd>>,
    /// A yield longer than this ran another thread ([`CONTENDED_YIELD_NS`]).
    contended_yield_ns: u64,
}

impl IdlePoll {
    pub(crate) fn new(most: Duration) -> IdlePoll {
        let most_ns = u64::try_from(most.as_nanos()).unwrap_or(u64::MAX);
        IdlePoll {
            most_ns,
            window_ns: AtomicU64::new(most_ns / 8),
            slept_at_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            fds: Mutex::new(Vec::new()),
            contended_yield_ns: CONTENDED_YIELD_NS,
        }
    }

    /// The `epoll` descriptors open now: taken before and after a runtime is built, their
    /// difference is the runtime's.
    pub(crate) fn epoll_fds() -> Vec<RawFd> {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
        let mut fds: Vec<RawFd> = dir
            .flatten()
            .filter(|entry| {
                std::fs::read_link(entry.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:[eventpoll]")
            })
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect();
        fds.sort_unstable();
        fds
    }

    /// The loop's descriptors: those of `after` not in `before`.
    pub(crate) fn watch(&self, before: &[RawFd], after: &[RawFd]) {
        let new = after.iter().filter(|fd| !before.contains(fd)).copied().collect();
        *self.fds.lock().expect("never poisoned") = new;
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
    }

    /// Called as the loop is about to sleep: reaps its ring, then, with a window, polls its
    /// descriptors for it.
    pub(crate) fn before_park(&self) {
        if reap_ring() {
            self.slept_at_ns.store(0, Ordering::Relaxed);
            return;
        }
        if self.most_ns == 0 {
            // A core that never polls only reaps.
            return;
        }
        if requests_are_large() {
            // No poll, and the sleep is not counted: how soon a stream's next event comes says
            // nothing of the window the core's small requests want once they return.
            self.slept_at_ns.store(0, Ordering::Relaxed);
            return;
        }
        let window = self.window_ns.load(Ordering::Relaxed);
        let start = self.now_ns();
        if window == 0 {
            // No poll; the sleep still counts, so that quick wake-ups open the window again.
            self.slept_at_ns.store(start, Ordering::Relaxed);
            return;
        }
        let mut fds: Vec<libc::pollfd> = self
            .fds
            .lock()
            .expect("never poisoned")
            .iter()
            .map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let mut end = start.saturating_add(window);
        // Held to an engine timer: the wake-up it brings says nothing of the clients' pace.
        let mut timed = false;
        if let Some(deadline) = NEXT_DEADLINE.with(Cell::get) {
            let now = Instant::now();
            let left = u64::try_from(deadline.saturating_duration_since(now).as_nanos())
                .unwrap_or(u64::MAX);
            if left == 0 {
                NEXT_DEADLINE.with(|next| next.set(None));
            }
            if left < window {
                (end, timed) = (start.saturating_add(left), true);
            }
        }
        if fds.is_empty() {
            end = start;
        }
        while self.now_ns() < end {
            if reap_ring() {
                self.slept_at_ns.store(0, Ordering::Relaxed);
                return;
            }
            let nfds = libc::nfds_t::try_from(fds.len()).expect("a few descriptors");
            // SAFETY: `fds` is a live array of `nfds` pollfd entries; a zero timeout never
            // blocks.
            if unsafe { libc::poll(fds.as_mut_ptr(), nfds, 0) } != 0 {
                // A descriptor that is no longer open (not the loop's own, which lives as
                // long as this) would end every poll: it is watched no more.
                if fds.iter().any(|fd| fd.revents & libc::POLLNVAL != 0) {
                    let closed: Vec<RawFd> = fds
                        .iter()
                        .filter(|fd| fd.revents & libc::POLLNVAL != 0)
                        .map(|fd| fd.fd)
                        .collect();
                    self.fds.lock().expect("never poisoned").retain(|fd| !closed.contains(fd));
                }
                // The event may be the ring's: its completion was posted as this call returned.
                reap_ring();
                self.slept_at_ns.store(0, Ordering::Relaxed);
                return;
            }
            let yielded_at = self.now_ns();
            // SAFETY: takes no arguments; lets a thread waiting for this CPU run first.
            unsafe { libc::sched_yield() };
            if self.now_ns().saturating_sub(yielded_at) > self.contended_yield_ns {
                // Another thread had this CPU meanwhile: the CPU is wanted, and a poll would
                // take from whoever wants it. Sleep, and poll no more until quick wake-ups
                // widen the window again.
                self.window_ns.store(0, Ordering::Relaxed);
                self.slept_at_ns.store(0, Ordering::Relaxed);
                return;
            }
        }
        let slept_at = if timed { 0 } else { self.now_ns() };
        self.slept_at_ns.store(slept_at, Ordering::Relaxed);
    }

    /// Called as the loop wakes: after a sleep, widens or narrows the window by how long it
    /// slept.
    pub(crate) fn after_unpark(&self) {
        let slept_at = self.slept_at_ns.swap(0, Ordering::Relaxed);
        if slept_at == 0 || self.most_ns == 0 {
            return;
        }
        let slept = self.now_ns().saturating_sub(slept_at);
        let window = self.window_ns.load(Ordering::Relaxed);
        self.window_ns.store(next_window(window, slept, self.most_ns), Ordering::Relaxed);
    }

    #[cfg(test)]
    fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }
}

/// The window after a poll of `window` ns gave up and the loop slept `slept` ns: doubled (from
/// an eighth of the most, at most the most) when a window that long would have caught the
/// event, else halved, to none below an eighth.
fn next_window(window: u64, slept: u64, most: u64) -> u64 {
    let start = most / 8;
    if window.saturating_add(slept) <= most {
        window.saturating_mul(2).max(start).min(most)
    } else if window / 2 < start {
        0
    } else {
        window / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// A poll of at most `most` watching `fd`, whose yields never count as contended (so the
    /// machine's load cannot end a test's poll).
    fn watching(most: Duration, fd: &impl std::os::fd::AsRawFd) -> IdlePoll {
        let mut poll = IdlePoll::new(most);
        poll.contended_yield_ns = u64::MAX;
        poll.watch(&[], &[fd.as_raw_fd()]);
        poll
    }

    /// The window doubles while events come soon after a poll gives up, never past the most;
    /// halves after long sleeps, to none; and starts again from none on a quick wake-up.
    #[test]
    fn the_window_follows_how_soon_events_come() {
        let most = 800 * US;
        let poll = IdlePoll::new(Duration::from_nanos(most));
        assert_eq!(poll.window(), Duration::from_micros(100), "it starts at an eighth");
        let mut window = 100 * US;
        for expected in [200, 400, 800] {
            window = next_window(window, 10 * US, most);
            assert_eq!(window, expected * US);
        }
        // At the most, a poll that gave up means an event later than the most.
        window = next_window(window, 10 * US, most);
        assert_eq!(window, 400 * US);
        window = next_window(window, 10 * US, most);
        for expected in [400, 200, 100, 0, 0] {
            window = next_window(window, 2_000 * US, most);
            assert_eq!(window, expected * US);
        }
        assert_eq!(next_window(0, 10 * US, most), 100 * US);
        // An event just past what the window would have caught: it still grows.
        assert_eq!(next_window(100 * US, 700 * US, most), 200 * US);
        assert_eq!(next_window(100 * US, 701 * US, most), 0);
    }

    /// A poll with nothing to watch, or none allowed, sleeps at once and counts as a sleep.
    #[test]
    fn without_descriptors_the_loop_sleeps_at_once() {
        let poll = IdlePoll::new(Duration::from_secs(80));
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() < Duration::from_secs(5), "no descriptors: no poll");
        assert_ne!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "it slept");
        poll.after_unpark();
        assert_eq!(poll.window(), Duration::from_secs(20), "a quick wake-up widened it");
    }

    /// A readable descriptor ends the poll at once, without counting as a sleep; an idle one
    /// holds it for the window.
    #[test]
    fn a_ready_descriptor_ends_the_poll() {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let poll = watching(Duration::from_millis(160), &theirs);
        let window = poll.window();
        assert_eq!(window, Duration::from_millis(20));
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() >= window, "an idle descriptor: polled for the window");
        assert_ne!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "then slept");
        let poll = watching(Duration::from_secs(80), &theirs);
        std::io::Write::write_all(&mut ours, b"x").unwrap();
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() < Duration::from_secs(5), "a readable descriptor ends it");
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "and it did not sleep");
        poll.after_unpark();
        assert_eq!(poll.window(), Duration::from_secs(10), "which leaves the window");
    }

    /// A completion in the core's ring is reaped by the loop about to sleep, and the loop then
    /// does not sleep: one posted before the poll (found first), and one posted while it polls
    /// (the ring's descriptor turns readable). Either way the operation's future is finished
    /// without the reactor or the reaper task.
    #[test]
    fn a_ring_completion_is_reaped_before_the_loop_sleeps() {
        use std::future::Future;
        use std::io::Write;
        use std::task::{Context, Poll, Waker};
        let finished = |op: &mut std::pin::Pin<&mut dyn Future<Output = i32>>| {
            op.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        };
        // Where io_uring is refused the loop has no ring to reap.
        let Ok(ring) = core_ring::install() else { return };
        let (mut near, far) = std::os::unix::net::UnixStream::pair().unwrap();
        let op = core_ring::read_stream(far, 1).expect("a ring is installed");
        let mut op: std::pin::Pin<&mut dyn Future<Output = i32>> = std::pin::pin!(op);
        assert_eq!(finished(&mut op), Poll::Pending);
        // The kernel posts the read's completion as this thread leaves the write (no deferred
        // task work): it waits before the poll starts. No descriptors: no poll either way.
        near.write_all(b"x").unwrap();
        assert!(core_ring::has_completions());
        let poll = IdlePoll::new(Duration::from_secs(80));
        poll.before_park();
        assert!(!core_ring::has_completions(), "the completion was reaped");
        assert_eq!(finished(&mut op), Poll::Ready(1), "and the read's future finished");
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "the loop did not sleep");

        let (mut near, far) = std::os::unix::net::UnixStream::pair().unwrap();
        let op = core_ring::read_stream(far, 1).expect("a ring is installed");
        let mut op: std::pin::Pin<&mut dyn Future<Output = i32>> = std::pin::pin!(op);
        assert_eq!(finished(&mut op), Poll::Pending);
        let poll = watching(Duration::from_secs(80), &ring);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            near.write_all(b"y").unwrap();
            near
        });
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() < Duration::from_secs(5), "the completion ended the poll");
        assert_eq!(finished(&mut op), Poll::Ready(1), "reaped by the poll");
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "the loop did not sleep");
        drop(writer.join().unwrap());
        core_ring::uninstall();
    }

    /// With no window the hook only reaps: nothing to reap, it returns at once without
    /// counting a sleep, and its window never opens.
    #[test]
    fn no_window_no_poll() {
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let poll = watching(Duration::ZERO, &theirs);
        poll.before_park();
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0);
        poll.after_unpark();
        assert_eq!(poll.window_ns.load(Ordering::Relaxed), 0);
    }

    /// An engine sleep's deadline ends the poll before the window does.
    #[test]
    fn a_timer_due_ends_the_poll() {
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let poll = watching(Duration::from_secs(80), &theirs);
        note_deadline(Instant::now() + Duration::from_millis(20));
        let start = Instant::now();
        poll.before_park();
        let held = start.elapsed();
        assert!(held < Duration::from_secs(5), "held to the deadline, not the window");
        // Once the deadline has passed, the next poll does not poll (the loop has a timer to
        // fire), and the one after runs its window (shortened here).
        std::thread::sleep(Duration::from_millis(25));
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() < Duration::from_secs(5), "a timer due: no poll");
        let poll = watching(Duration::from_millis(160), &theirs);
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    /// A core whose recent requests are large sleeps at once, leaving its window as it was;
    /// once its requests are small again, it polls.
    #[test]
    fn large_requests_end_the_poll() {
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        // A stream's requests, after small ones: large within three.
        for _ in 0..16 {
            sluice_engine::rt::note_request(4096);
        }
        assert!(!requests_are_large());
        for _ in 0..3 {
            sluice_engine::rt::note_request(1 << 20);
        }
        assert!(requests_are_large());
        let poll = watching(Duration::from_secs(80), &theirs);
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() < Duration::from_secs(5), "large requests: no poll");
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "not counted as a sleep");
        poll.after_unpark();
        assert_eq!(poll.window(), Duration::from_secs(10), "the window is left as it was");
        // A window closed (by contention, or long waits) stays closed through them.
        poll.window_ns.store(0, Ordering::Relaxed);
        poll.before_park();
        poll.after_unpark();
        assert_eq!(poll.window(), Duration::ZERO, "not reopened by the stream's wake-ups");
        // A small writer beside a stream, one request each: the bytes are the stream's.
        for _ in 0..32 {
            sluice_engine::rt::note_request(4096);
            sluice_engine::rt::note_request(1 << 20);
        }
        assert!(requests_are_large());
        // The stream ends; the small writer's requests bring the poll back.
        for _ in 0..11 {
            sluice_engine::rt::note_request(4096);
        }
        assert!(!requests_are_large());
        let poll = watching(Duration::from_millis(160), &theirs);
        let start = Instant::now();
        poll.before_park();
        assert!(start.elapsed() >= Duration::from_millis(20), "small requests: polled");
    }

    /// A yield that ran another thread on the same CPU ends the poll and closes the window.
    #[test]
    fn a_contended_cpu_ends_the_poll() {
        use std::os::fd::AsRawFd;
        // This thread and a busy one share one CPU.
        // SAFETY: sched_getcpu takes no arguments.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
        let pin = move || {
            // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity take
            // a live set of the size given.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                let pinned =
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                assert_eq!(pinned, 0, "pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
            }
        };
        pin();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                pin();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let poll = IdlePoll::new(Duration::from_secs(80));
        let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        poll.watch(&[], &[theirs.as_raw_fd()]);
        let start = Instant::now();
        poll.before_park();
        let held = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        assert!(held < Duration::from_secs(5), "the busy thread's turn ended the poll");
        assert_eq!(poll.window(), Duration::ZERO, "and closed the window");
        assert_eq!(poll.slept_at_ns.load(Ordering::Relaxed), 0, "not counted as a sleep");
    }
}
