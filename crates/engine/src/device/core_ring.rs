//! The serving core's own io_uring: device commands submitted and completed on the thread that
//! asked for them (run-to-completion, docs/design.md "Runtime model").
//!
//! `sluice serve` runs one event loop per core (crate `sluice-host`, `cores`). Each loop thread
//! [`install`]s a ring here; from then on every file-leaf read, write and durable write made on
//! that thread is pushed to that ring by the caller itself, and the loop reaps completions
//! ([`reap`]) when the ring's descriptor turns readable, waking the waiting futures on the same
//! thread; a serving core's loop also reaps them as it is about to sleep ([`has_completions`]).
//! No I/O thread, completion thread or channel sits between a request and its disk: a 4 KiB
//! sync write and its reply stay on one core, where before they crossed about fourteen thread
//! boundaries (docs/bench/peers-notes.md).
//!
//! A thread without a ring (the CLI's commands, tests, the simulator) keeps the device's own
//! paths (`device::uring` and the I/O threads), so nothing here is needed for correctness.
//!
//! Submission is batched per loop turn, as SPDK and Seastar do at the end of each poll: a push
//! only queues its entry and wakes the loop's submitter task ([`submitter`]), which tokio's
//! current-thread scheduler runs after the tasks already due on this turn. So the reads that a
//! batch of a client's requests starts reach the kernel in one `io_uring_enter`, which plugs the
//! block queue and tells the device once (one virtio notification, a VM exit, per batch instead
//! of per command: 7.7% of the serving core at 32 queued 4 KiB reads, perf 2026-11-26). A
//! log block's durable write and a flush are the exception ([`Submit::Now`]): a client waits
//! on each and a turn rarely holds two, so they go at once and take the turn's queue along; so
//! are a log commit's blocks written in place before their checksums ([`submit_queued`]). A
//! thread that runs no submitter (tests, or a loop that failed to start one) submits at each
//! push, as before.
//!
//! Ownership rules the kernel imposes (pitfalls seen in other io_uring runtimes): the ring's
//! table owns every buffer until that operation's completion is reaped, whether or not its
//! future is still waiting, so a dropped request never frees memory the kernel writes into; it
//! also holds the file whose descriptor the entry names (an entry may wait in the queue for the
//! turn's end), so a file whose last user went away cannot close and lend its number to another
//! before the kernel is done with it.
//! The ring is created on the thread that uses it and never leaves it (`SINGLE_ISSUER`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;

use super::{SharedBuf, UninitBuf};

/// Submission queue entries: more than the leaf queues of a core keep in flight. The
/// completion queue is twice as large (the kernel's default), so it cannot overflow.
const RING_ENTRIES: u32 = 1024;
/// Tries at a kernel short of completion room before leaving entries queued for the reaper.
const SUBMIT_ATTEMPTS_MAX: u32 = 8;

/// What a finished operation hands back to its future.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The kernel's result: bytes transferred, or a negative errno.
    pub result: i32,
    /// The read buffer, returned to the reader (filled as far as `result` says).
    pub buf: Option<UninitBuf>,
}

/// Where a completion meets its future; shared because a future may be dropped (or, in
/// principle, polled) elsewhere while the ring still holds the operation.
#[derive(Debug, Default)]
struct Slot {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
}

/// An operation the kernel holds, with what it reads into or writes from.
struct InFlight {
    slot: Arc<Mutex<Slot>>,
    /// Kept alive until the completion is reaped; handed to the reader then.
    read_buf: Option<UninitBuf>,
    _write_buf: Option<SharedBuf>,
    /// What keeps the entry's descriptor open until the completion is reaped.
    _file: FileRef,
}

/// What a pushed entry points at, handed to the ring to keep.
pub(super) struct Held {
    read_buf: Option<UninitBuf>,
    write_buf: Option<SharedBuf>,
    file: FileRef,
}

/// The owner of a descriptor an entry names: kept by the ring until the kernel is done with it.
pub(super) type FileRef = Arc<dyn std::any::Any + Send + Sync>;

/// When a pushed entry goes to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Submit {
    /// At once, with whatever is queued: a command someone is waiting on with nothing else
    /// to batch it with (a log block's durable write, a flush).
    Now,
    /// When the loop's submitter runs, with the rest of this turn's entries (reads, a txg
    /// sync's writes); at once on a thread without a submitter.
    WithTurn,
}

/// One core's ring and the operations it holds.
pub struct CoreRing {
    /// Unique in the process, so a submitter knows its own ring from a later one.
    id: u64,
    ring: RefCell<IoUring>,
    inflight: RefCell<HashMap<u64, InFlight>>,
    next_key: Cell<u64>,
    /// Set when `enter` failed with entries queued: nothing is submitted from then on, so an
    /// entry whose operation was answered with the error can never reach the kernel later.
    dead: Cell<bool>,
    /// The loop's submitter task (its id and waker), woken by the first push of a turn;
    /// `None` while none runs, and then every push submits itself.
    submitter: RefCell<Option<(u64, Waker)>>,
    /// Entries queued since the submitter last ran (it is woken once per batch).
    submit_due: Cell<bool>,
}

impl std::fmt::Debug for CoreRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreRing").field("inflight", &self.inflight.borrow().len()).finish()
    }
}

thread_local! {
    static CORE: RefCell<Option<Rc<CoreRing>>> = const { RefCell::new(None) };
}

/// Creates this thread's ring and returns its descriptor, which turns readable when
/// completions wait to be reaped. Fails where the kernel (or a seccomp profile) refuses
/// io_uring; the thread then keeps the devices' own paths.
pub fn install() -> io::Result<RawFd> {
    // Single issuer: only this thread submits, which lets the kernel skip its locking.
    // Cooperative task running: a completion the kernel hands this thread as task work (a
    // direct read or write, a socket read) while the thread runs on another CPU waits for the
    // thread's next entry into the kernel (a system call, or an interrupt on its CPU) instead of
    // an inter-processor interrupt, which on a VM costs an exit on the sender and often on the
    // receiver; a sleeping thread is woken as before. The task-run flag tells
    // [`has_completions`] that some wait so ([`CoreRing::reap`] enters the kernel for them).
    // An older kernel gets what it has: Linux 5.19 added cooperative task running, 6.0 the
    // single issuer.
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(RING_ENTRIES)
        .or_else(|_| {
            IoUring::builder().setup_coop_taskrun().setup_taskrun_flag().build(RING_ENTRIES)
        })
        .or_else(|_| IoUring::new(RING_ENTRIES))?;
    // A first submission proves the kernel accepts them (seccomp may allow setup, refuse enter).
    ring.submitter().submit()?;
    let fd = ring.as_raw_fd();
    let core = Rc::new(CoreRing {
        id: next_id(),
        ring: RefCell::new(ring),
        inflight: RefCell::new(HashMap::with_capacity(RING_ENTRIES as usize)),
        next_key: Cell::new(0),
        dead: Cell::new(false),
        submitter: RefCell::new(None),
        submit_due: Cell::new(false),
    });
    CORE.with(|c| *c.borrow_mut() = Some(core));
    Ok(fd)
}

/// Whether this thread has a ring.
pub fn installed() -> bool {
    CORE.with(|c| c.borrow().is_some())
}

/// Operations this thread's ring holds (0 without a ring).
pub fn inflight() -> usize {
    CORE.with(|c| c.borrow().as_ref().map_or(0, |core| core.inflight.borrow().len()))
}

/// Whether completions wait in this thread's ring to be reaped (false without a ring): a look
/// at the completion queue and the flags the kernel shares, no system call. For a loop about
/// to sleep, or a long task's pause (`sluice-host`'s `CoreSpawn::yield_now`), which
/// can reap them itself ([`reap`]) instead of waiting for its reactor to report the ring's
/// descriptor readable.
pub fn has_completions() -> bool {
    CORE.with(|c| {
        let core = c.borrow();
        // A ring borrowed meanwhile is in a push, a submission or a reap (never, when a loop's
        // park hook asks): its completions are looked at again at the next park.
        core.as_ref().is_some_and(|core| {
            core.ring.try_borrow_mut().is_ok_and(|mut ring| {
                // Also completions the kernel has not posted yet: they wait for this thread to
                // enter it (cooperative task running, see [`install`]). The flag may read clear
                // while such work waits (the kernel sets it as the thread's list of work turns
                // non-empty); a loop that then sleeps is woken for the work at once.
                ring.submission().taskrun() || !ring.completion().is_empty()
            })
        })
    })
}

/// Completes every operation whose completion has arrived, waking its future. Returns how many
/// futures it woke: an operation whose future was dropped (a cancelled request) or not yet
/// polled completes without waking anything.
pub fn reap() -> usize {
    let Some(core) = CORE.with(|c| c.borrow().clone()) else { return 0 };
    core.reap()
}

/// Submits what this thread's pushes have queued for the submitter, now (nothing without a
/// ring, or with nothing queued): for a caller that started writes a client waits on and has
/// CPU work to do before its task ends its turn (a log commit's blocks written in place,
/// checksummed while the device writes them).
pub fn submit_queued() {
    if let Some(core) = CORE.with(|c| c.borrow().clone()) {
        core.submit_due_entries();
    }
}

/// The task that submits what this turn's pushes queued: spawn it on the loop that owns the
/// ring, beside the reaper. While it is parked, a push wakes it instead of submitting, so every
/// entry queued before it runs goes to the kernel in one call. Dropping it, or
/// [`stop_submitter`], submits what is queued and returns the ring to submitting at each push.
/// It serves the ring of the thread it is first polled on (for a current-thread loop, always
/// the ring's), and ends if that ring is replaced.
pub fn submitter() -> Submitter {
    Submitter { id: next_id(), ring: None }
}

/// A process-wide unique id (of a ring or a submitter).
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Stops this thread's submitter, if one is registered: submits what is queued, and pushes
/// submit themselves from now on. For a loop that stops polling its tasks (a `block_on` that
/// returns) before they are dropped.
pub fn stop_submitter() {
    if let Some(core) = CORE.with(|c| c.borrow().clone()) {
        core.unregister_submitter();
    }
}

/// See [`submitter`].
#[derive(Debug)]
pub struct Submitter {
    id: u64,
    /// The id of the ring it registered with: a ring installed later on the same thread is
    /// not its own.
    ring: Option<u64>,
}

impl Future for Submitter {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(core) = CORE.with(|c| c.borrow().clone()) else { return Poll::Ready(()) };
        let first = self.ring.is_none();
        if *self.ring.get_or_insert(core.id) != core.id {
            return Poll::Ready(()); // its ring was replaced
        }
        core.submit_due_entries();
        let mut registered = core.submitter.borrow_mut();
        match registered.as_mut() {
            Some((id, waker)) if *id == self.id => {
                if !waker.will_wake(cx.waker()) {
                    *waker = cx.waker().clone();
                }
            }
            None if first => *registered = Some((self.id, cx.waker().clone())),
            // Another submitter serves this ring, or this one was stopped: it ends.
            _ => return Poll::Ready(()),
        }
        Poll::Pending
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        // `try_with`: a loop dropped while the thread's locals are torn down has no ring left.
        let core = CORE.try_with(|c| c.borrow().clone()).ok().flatten();
        let Some(core) = core else { return };
        if self.ring != Some(core.id) {
            return;
        }
        let mine = core.submitter.borrow().as_ref().is_some_and(|(id, _)| *id == self.id);
        if mine {
            core.unregister_submitter();
        }
    }
}

/// Removes this thread's ring. Operations still in flight keep their buffers: the ring's memory
/// (and theirs) is freed only after the kernel has dropped the ring, when it no longer uses them.
pub fn uninstall() {
    CORE.with(|c| c.borrow_mut().take());
}

/// Pushes an operation onto this thread's ring, or returns `None` when the thread has none.
pub(super) fn push(
    entry: squeue::Entry,
    read_buf: Option<UninitBuf>,
    write_buf: Option<SharedBuf>,
    file: FileRef,
    when: Submit,
) -> Option<RingOp> {
    let core = CORE.with(|c| c.borrow().clone())?;
    Some(core.push(entry, Held { read_buf, write_buf, file }, when))
}

/// A read into a fresh buffer of `len` bytes (not zeroed: see [`UninitBuf`]).
/// `file` keeps `fd` open until the read is reaped.
pub(super) fn read(fd: RawFd, file: FileRef, offset: u64, len: u32) -> Option<RingOp> {
    if !installed() {
        return None;
    }
    let mut buf = UninitBuf::new(len as usize);
    let entry = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset).build();
    push(entry, Some(buf), None, file, Submit::WithTurn)
}

/// A read of up to `len` bytes at a stream's position (a pipe's, a socket's) through this
/// thread's ring, submitted at once: the kernel's answer (bytes read, or a negative errno;
/// the bytes themselves are dropped). Tests of the loops that reap a ring use it for an
/// operation whose completion they control, which no device command is. The ring holds
/// `stream` until the completion is reaped, as it holds a leaf's file. `None` without a ring.
#[cfg(feature = "testing")]
pub fn read_stream<S: AsRawFd + Send + Sync + 'static>(
    stream: S,
    len: u32,
) -> Option<impl Future<Output = i32>> {
    if !installed() {
        return None;
    }
    let mut buf = UninitBuf::new(len as usize);
    let fd = types::Fd(stream.as_raw_fd());
    // Offset -1: the stream's own position (a pipe or socket has none to seek).
    let entry = opcode::Read::new(fd, buf.as_mut_ptr(), len).offset(u64::MAX).build();
    let op = push(entry, Some(buf), None, Arc::new(stream), Submit::Now)?;
    Some(async move { op.await.result })
}

/// A write; with `dsync` it is durable when it completes (`RWF_DSYNC`: on a device with FUA one
/// FUA write, else the kernel's write-then-flush, with no second trip from user space).
/// `file` keeps `fd` open until the write is reaped.
pub(super) fn write(
    fd: RawFd,
    file: FileRef,
    offset: u64,
    data: SharedBuf,
    dsync: bool,
) -> Option<RingOp> {
    if !installed() {
        return None;
    }
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    // A durable write is a log block a client's flush waits for: it goes now, taking along
    // whatever this turn queued. Other writes (a txg sync's) go with the turn.
    let when = if dsync { Submit::Now } else { Submit::WithTurn };
    push(write_entry(fd, offset, &data, flags), None, Some(data), file, when)
}

/// The submission entry that writes `data` at `offset`: a vectored write straight from its
/// pieces when it is pieces, else a plain write. The entry points into `data`, which the caller
/// keeps alive until the completion is reaped.
pub(super) fn write_entry(fd: RawFd, offset: u64, data: &SharedBuf, flags: i32) -> squeue::Entry {
    match data.iovecs() {
        Some(iovecs) => {
            let count = u32::try_from(iovecs.len()).expect("at most IOVECS_MAX pieces");
            opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), count)
                .offset(offset)
                .rw_flags(flags)
                .build()
        }
        None => opcode::Write::new(types::Fd(fd), data.as_ptr(), data.len_bytes())
            .offset(offset)
            .rw_flags(flags)
            .build(),
    }
}

/// `fdatasync` through the ring (the kernel runs it on a worker of its own).
pub(super) fn fdatasync(fd: RawFd, file: FileRef) -> Option<RingOp> {
    if !installed() {
        return None;
    }
    let entry = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build();
    push(entry, None, None, file, Submit::Now)
}

impl CoreRing {
    fn push(&self, entry: squeue::Entry, held: Held, when: Submit) -> RingOp {
        let Held { read_buf, write_buf, file } = held;
        let key = self.next_key.get();
        self.next_key.set(key.wrapping_add(1));
        let slot = Arc::new(Mutex::new(Slot::default()));
        if self.dead.get() {
            // Nothing reaches the kernel any more; the buffers were never lent to it.
            slot.lock().outcome = Some(Outcome { result: -libc::EIO, buf: read_buf });
            return RingOp { slot };
        }
        self.inflight.borrow_mut().insert(
            key,
            InFlight { slot: Arc::clone(&slot), read_buf, _write_buf: write_buf, _file: file },
        );
        let entry = entry.user_data(key);
        // Room in the submission queue: a full one is submitted first.
        loop {
            let mut ring = self.ring.borrow_mut();
            // SAFETY: the entry's buffer (if any) is owned by `inflight` until its completion
            // is reaped, and its descriptor is submitted below, before the caller can close it.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                break;
            }
            if let Err(e) = self.submit_or_reap(ring) {
                self.complete(key, -e.raw_os_error().unwrap_or(libc::EIO));
                return RingOp { slot };
            }
        }
        if when == Submit::WithTurn && self.submitter.borrow().is_some() {
            // The loop's submitter sends this turn's entries together; woken once per batch,
            // outside the borrow (a waker is foreign code).
            if !self.submit_due.replace(true) {
                let waker = self.submitter.borrow().as_ref().map(|(_, w)| w.clone());
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            return RingOp { slot };
        }
        // Whatever this turn queued goes too; the submitter then finds nothing to do.
        self.submit_due.set(false);
        let ring = self.ring.borrow_mut();
        if let Err(e) = self.submit_or_reap(ring) {
            self.die(-e.raw_os_error().unwrap_or(libc::EIO));
        }
        RingOp { slot }
    }

    /// Pushes submit themselves from now on; what is queued goes now.
    fn unregister_submitter(&self) {
        self.submitter.borrow_mut().take();
        self.submit_due_entries();
    }

    /// Submits what pushes queued since the submitter last ran.
    fn submit_due_entries(&self) {
        if self.submit_due.replace(false) {
            let mut ring = self.ring.borrow_mut();
            if ring.submission().is_empty() {
                return; // sent already, by a push that went at once or by the reaper
            }
            if let Err(e) = self.submit_or_reap(ring) {
                self.die(-e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }

    /// The ring refused `enter` with entries queued: every operation it holds is answered with
    /// `result` at once. Entries may still sit in the queue, so nothing is submitted from now
    /// on, and their buffers are leaked rather than freed under entries that point at them
    /// (an operation already in the kernel completes into a buffer that stays valid).
    fn die(&self, result: i32) {
        self.dead.set(true);
        let ops: Vec<InFlight> = self.inflight.borrow_mut().drain().map(|(_, op)| op).collect();
        for op in ops {
            let waker = {
                let mut slot = op.slot.lock();
                slot.outcome = Some(Outcome { result, buf: None });
                slot.waker.take()
            };
            std::mem::forget(op.read_buf);
            std::mem::forget(op._write_buf);
            // Its descriptor stays open too: entries naming it may still sit in the queue.
            std::mem::forget(op._file);
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// Submits what is queued. A kernel short of room for completions (`EBUSY`) gets them
    /// reaped here, on the one thread that may; after a few tries the entries stay queued for
    /// the next submission, which the reaper also makes.
    fn submit_or_reap(&self, ring: std::cell::RefMut<'_, IoUring>) -> io::Result<()> {
        let mut ring = Some(ring);
        for _ in 0..SUBMIT_ATTEMPTS_MAX {
            let result = ring.as_mut().map_or(Ok(0), |r| r.submit());
            match result {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => {
                    // Released first: reaping borrows the ring.
                    drop(ring.take());
                    self.reap();
                    ring = Some(self.ring.borrow_mut());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn reap(&self) -> usize {
        let mut woken = 0;
        {
            let mut ring = self.ring.borrow_mut();
            // Entries queued (by this turn's pushes, ahead of the submitter, or left by a
            // kernel that was short of room: EBUSY again leaves them for the next turn), or
            // completions that wait for this thread to enter the kernel, which posts them
            // before it returns.
            let due = !ring.submission().is_empty() || ring.submission().taskrun();
            if due && !self.dead.get() {
                let _ = ring.submit();
            }
        }
        loop {
            // Copied out first: completing wakes futures, which may push (and borrow the ring).
            let batch: Vec<(u64, i32)> = {
                let mut ring = self.ring.borrow_mut();
                ring.completion().take(256).map(|cqe| (cqe.user_data(), cqe.result())).collect()
            };
            if batch.is_empty() {
                return woken;
            }
            for (key, result) in batch {
                woken += usize::from(self.complete(key, result));
            }
        }
    }

    /// Hands operation `key` its outcome; says whether that woke its future.
    fn complete(&self, key: u64, result: i32) -> bool {
        let Some(op) = self.inflight.borrow_mut().remove(&key) else { return false };
        let waker = {
            let mut slot = op.slot.lock();
            slot.outcome = Some(Outcome { result, buf: op.read_buf });
            slot.waker.take()
        };
        waker.map(Waker::wake).is_some()
    }
}

impl Drop for CoreRing {
    fn drop(&mut self) {
        // The kernel may still write into buffers of operations in flight: wait for them (a
        // bounded while), and leak what never completes rather than free memory it may use.
        for _ in 0..DRAIN_WAITS_MAX {
            if self.inflight.borrow().is_empty() {
                return;
            }
            let timeout = types::Timespec::new().nsec(10_000_000);
            let args = types::SubmitArgs::new().timespec(&timeout);
            let _ = self.ring.borrow().submitter().submit_with_args(1, &args);
            self.reap();
        }
        for (_, op) in self.inflight.borrow_mut().drain() {
            std::mem::forget(op);
        }
    }
}

/// Waits of 10 ms for operations in flight when a ring is removed.
const DRAIN_WAITS_MAX: u32 = 500;

/// The future of one ring operation: ready with the kernel's answer.
#[derive(Debug)]
pub(super) struct RingOp {
    slot: Arc<Mutex<Slot>>,
}

impl Future for RingOp {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut slot = self.slot.lock();
        match slot.outcome.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::AlignedBuf;

    /// A file of `len` bytes of `byte` in a fresh directory (kept by the caller), opened for
    /// reading and writing.
    fn scratch_file(
        byte: u8,
        len: usize,
    ) -> (tempfile::TempDir, std::path::PathBuf, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![byte; len]).unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        (dir, path, file)
    }

    /// A stand-in for a file's owner: each test keeps its file open itself.
    fn keep() -> FileRef {
        Arc::new(())
    }

    /// Reaps this thread's ring until `op` has its answer.
    fn wait(op: RingOp) -> Outcome {
        while inflight() > 0 {
            reap();
            std::thread::yield_now();
        }
        futures::executor::block_on(op)
    }

    /// A ring that failed `enter` answers what it holds and everything pushed later with an
    /// error, and never hands the kernel another entry: the file is not written.
    #[test]
    fn a_dead_ring_answers_with_errors_and_submits_nothing() {
        let (_dir, path, file) = scratch_file(0, 8192);
        std::thread::spawn(move || {
            if install().is_err() {
                return; // io_uring refused here; the device paths cover this thread.
            }
            let core = CORE.with(|c| c.borrow().clone()).unwrap();
            core.die(-libc::EIO);
            let data = AlignedBuf::copy_from(&[9u8; 4096]).into_shared();
            let outcome = wait(write(file.as_raw_fd(), keep(), 0, data, false).unwrap());
            assert_eq!(outcome.result, -libc::EIO);
            assert_eq!(inflight(), 0);
            reap();
            uninstall();
        })
        .join()
        .unwrap();
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0), "nothing was written");
    }

    /// Operations pushed on a thread with a ring complete once reaped, and a thread without one
    /// gets `None`.
    #[test]
    fn pushes_and_reaps_on_this_thread() {
        let (_dir, _path, file) = scratch_file(0, 8192);
        std::thread::spawn(move || {
            assert!(write(
                file.as_raw_fd(),
                keep(),
                0,
                AlignedBuf::zeroed(4096).into_shared(),
                false
            )
            .is_none());
            if install().is_err() {
                return; // io_uring refused here; the device paths cover this thread.
            }
            let data = AlignedBuf::copy_from(&[7u8; 4096]).into_shared();
            let op = write(file.as_raw_fd(), keep(), 4096, data, true).unwrap();
            let outcome = wait(op);
            assert_eq!(outcome.result, 4096);
            let op = read(file.as_raw_fd(), keep(), 4096, 4096).unwrap();
            let outcome = wait(op);
            assert_eq!(outcome.result, 4096);
            // SAFETY: the kernel reported all 4096 bytes read into the buffer.
            let read_back = unsafe { outcome.buf.unwrap().into_filled(4096) };
            assert!(read_back.iter().all(|&b| b == 7));
            // Pieces go to the kernel as they are, in order.
            let pieces = vec![
                Arc::new(AlignedBuf::copy_from(&[1u8; 2048])),
                Arc::new(AlignedBuf::copy_from(&[2u8; 2048])),
            ];
            let data = SharedBuf::gather(pieces);
            let outcome = wait(write(file.as_raw_fd(), keep(), 0, data.clone(), false).unwrap());
            assert_eq!(outcome.result, 4096);
            assert!(data.iovecs().is_some(), "written without joining the pieces");
            let outcome = wait(read(file.as_raw_fd(), keep(), 0, 4096).unwrap());
            assert_eq!(outcome.result, 4096);
            // SAFETY: as above.
            let read_back = unsafe { outcome.buf.unwrap().into_filled(4096) };
            assert!(read_back[..2048].iter().all(|&b| b == 1));
            assert!(read_back[2048..].iter().all(|&b| b == 2));
            uninstall();
        })
        .join()
        .unwrap();
    }

    /// With a submitter running, the turn's reads wait in the queue until it runs and then go
    /// in one call, its waker woken once for them; a durable write goes at once and takes the
    /// queue along; a dropped submitter sends what is queued, and pushes submit themselves again.
    #[test]
    fn a_submitter_sends_a_turn_together_and_a_durable_write_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        struct Count(AtomicUsize);
        impl futures::task::ArcWake for Count {
            fn wake_by_ref(arc_self: &Arc<Self>) {
                arc_self.0.fetch_add(1, Ordering::SeqCst);
            }
        }

        let (_dir, _path, file) = scratch_file(5, 16384);
        std::thread::spawn(move || {
            if install().is_err() {
                return; // io_uring refused here; the device paths cover this thread.
            }
            let fd = file.as_raw_fd();
            let core = CORE.with(|c| c.borrow().clone()).unwrap();
            let queued = || core.ring.borrow_mut().submission().len();
            let wakes = Arc::new(Count(AtomicUsize::new(0)));
            let waker = futures::task::waker(Arc::clone(&wakes));
            let mut cx = Context::from_waker(&waker);
            let mut turn = Box::pin(submitter());
            assert!(turn.as_mut().poll(&mut cx).is_pending());

            let reads = [read(fd, keep(), 0, 4096).unwrap(), read(fd, keep(), 4096, 4096).unwrap()];
            assert_eq!(queued(), 2, "reads wait for the turn's end");
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken once per batch");
            assert!(turn.as_mut().poll(&mut cx).is_pending());
            assert_eq!(queued(), 0, "the submitter sent both");

            let owner = keep();
            let late = read(fd, Arc::clone(&owner), 8192, 4096).unwrap();
            assert_eq!(queued(), 1);
            assert_eq!(Arc::strong_count(&owner), 2, "the ring keeps the file open");
            let data = AlignedBuf::copy_from(&[7u8; 4096]).into_shared();
            let durable = write(fd, keep(), 12288, data, true).unwrap();
            assert_eq!(queued(), 0, "a durable write goes at once, and the read with it");
            assert!(!core.submit_due.get());
            assert_eq!(wait(durable).result, 4096);

            let last = read(fd, keep(), 12288, 4096).unwrap();
            assert_eq!(queued(), 1);
            drop(turn);
            assert_eq!(queued(), 0, "a dropped submitter sends what is queued");
            let after = read(fd, keep(), 0, 4096).unwrap();
            assert_eq!(queued(), 0, "and pushes submit themselves again");

            // A loop that stops polling stops its submitter at once; polled again, it ends.
            let mut turn = Box::pin(submitter());
            assert!(turn.as_mut().poll(&mut cx).is_pending());
            let queued_read = read(fd, keep(), 4096, 4096).unwrap();
            assert_eq!(queued(), 1);
            stop_submitter();
            assert_eq!(queued(), 0, "stopping sends what is queued");
            assert!(turn.as_mut().poll(&mut cx).is_ready(), "a stopped submitter ends");
            let unbatched = read(fd, keep(), 8192, 4096).unwrap();
            assert_eq!(queued(), 0);
            // A second submitter does not take over a ring another one serves.
            let mut serving = Box::pin(submitter());
            let mut other = Box::pin(submitter());
            assert!(serving.as_mut().poll(&mut cx).is_pending());
            assert!(other.as_mut().poll(&mut cx).is_ready());
            drop(other);
            let batched = read(fd, keep(), 0, 4096).unwrap();
            assert_eq!(queued(), 1, "the first one still serves it");
            drop(serving);
            assert_eq!(queued(), 0);

            let [first, second] = reads;
            for op in [first, second, late, after, queued_read, unbatched, batched] {
                assert_eq!(wait(op).result, 4096);
            }
            assert_eq!(Arc::strong_count(&owner), 1, "and lets it go once reaped");
            let outcome = wait(last);
            assert_eq!(outcome.result, 4096);
            // SAFETY: the kernel reported all 4096 bytes read into the buffer.
            let read_back = unsafe { outcome.buf.unwrap().into_filled(4096) };
            assert!(read_back.iter().all(|&b| b == 7), "the durable write is read back");
            drop(core);
            uninstall();
        })
        .join()
        .unwrap();
    }
}
