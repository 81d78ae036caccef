//! io_uring submission for file leaves: reads and writes without a thread trip each.
//!
//! With blocking calls on I/O threads, every device command was handed to a thread that then
//! slept in the kernel while the disk worked: about three context switches per command. On a
//! VM each switch is dear. Measured over NBD, 4 KiB random reads at queue depth 32: sluice
//! spent 44 us of CPU per read against qemu-nbd's 19 us (which submits through Linux AIO and
//! switched 0.06 times per read), and the profile put a quarter of sluice's time in
//! `finish_task_switch`. Here the caller's thread submits (one `io_uring_enter`, no switch),
//! and one completion thread per device reaps completions in batches and completes the
//! waiting futures.
//!
//! The kernel writes into and reads from buffers the pending-op table owns until their
//! completion is reaped, so a caller that stops waiting cannot free memory the kernel still
//! uses. Rare outcomes take the blocking path on the completion thread: a short transfer is
//! finished with the ordinary calls, and a filesystem that refuses O_DIRECT (EINVAL) switches
//! the device to buffered I/O, as on the I/O threads. Where io_uring is unavailable (old
//! kernels, or a container whose seccomp profile refuses `io_uring_setup`), the device keeps
//! its I/O threads for everything. Flushes stay on the I/O threads in any case: the ring runs
//! a flush on a worker thread of its own and answers through the completion thread, one trip
//! more than an I/O thread's `fdatasync` (measured: log flush p50 234-247 us on the I/O
//! threads, 261-313 us through the ring).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread;

use futures::channel::oneshot;
use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;

use super::{AlignedBuf, DeviceError, DeviceOp, SharedBuf, UninitBuf};

/// What a ring submits to and completes through: the file device's open descriptors
/// (device::file implements it), a trait here so that this file does not import the device
/// it serves.
pub(super) trait Target: Send + Sync {
    /// The descriptor a read of `len` bytes into `addr` at `offset` goes to (O_DIRECT when
    /// it may).
    fn fd_for(&self, offset: u64, len: usize, addr: *const u8) -> std::os::fd::RawFd;
    /// The descriptor a write of `data` at `offset` goes to.
    fn fd_for_write(&self, offset: u64, data: &SharedBuf) -> std::os::fd::RawFd;
    /// The device's error for a failed operation.
    fn error(&self, op: DeviceOp, offset: u64, len: u64, source: io::Error) -> DeviceError;
    /// The answer to a read the kernel completed with `result`.
    fn complete_read(
        &self,
        offset: u64,
        buf: UninitBuf,
        result: i32,
    ) -> Result<AlignedBuf, DeviceError>;
    /// The answer to a write the kernel completed with `result`.
    fn complete_write(&self, offset: u64, data: &SharedBuf, result: i32)
        -> Result<(), DeviceError>;
}

/// Submission queue entries per device: more than any leaf queue keeps in flight.
const RING_ENTRIES: u32 = 256;
/// The user data of the entry that tells the completion thread to stop.
const STOP: u64 = u64::MAX;
/// Tries at a full submission queue before an operation is failed instead (each try submits
/// and yields, so the completion thread can drain the ring meanwhile).
const PUSH_ATTEMPTS_MAX: u32 = 100_000;

type Done<T> = oneshot::Sender<Result<T, DeviceError>>;

/// An operation the kernel holds, with what it reads into or writes from.
enum Op {
    Read { offset: u64, buf: UninitBuf, done: Done<AlignedBuf> },
    Write { offset: u64, data: SharedBuf, done: Done<()> },
}

/// One device's ring.
pub(super) struct Uring {
    ring: IoUring,
    /// Serializes access to the submission queue (the crate's shared access needs it).
    submit: Mutex<()>,
    /// Next key, and the operations the kernel holds by key; `None` once the ring has failed
    /// (every later operation is answered with an error at once instead of waiting forever).
    pending: Mutex<Option<(u64, HashMap<u64, Op>)>>,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = self.pending.lock().as_ref().map(|p| p.1.len());
        f.debug_struct("Uring").field("pending", &pending).finish()
    }
}

impl Uring {
    /// A ring and its completion thread, or the reason io_uring cannot be used here.
    pub(super) fn start(
        inner: Arc<dyn Target>,
        name: &str,
    ) -> io::Result<(Arc<Uring>, thread::JoinHandle<()>)> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let uring = Arc::new(Uring {
            ring,
            submit: Mutex::new(()),
            pending: Mutex::new(Some((0, HashMap::new()))),
        });
        // A first operation proves the kernel accepts submissions (a seccomp profile may allow
        // setup and refuse enter).
        uring.ring.submitter().submit()?;
        let me = Arc::clone(&uring);
        let handle = thread::Builder::new()
            .name(format!("vdev_uring/{}", short(name)))
            .spawn(move || me.complete_forever(&*inner))?;
        Ok((uring, handle))
    }

    pub(super) fn read(&self, inner: &dyn Target, offset: u64, len: u32, done: Done<AlignedBuf>) {
        let mut buf = UninitBuf::new(len as usize);
        let fd = inner.fd_for(offset, buf.len(), buf.as_mut_ptr());
        let entry = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset).build();
        self.push(inner, entry, Op::Read { offset, buf, done });
    }

    pub(super) fn write(&self, inner: &dyn Target, offset: u64, data: SharedBuf, done: Done<()>) {
        let fd = inner.fd_for_write(offset, &data);
        let entry = super::core_ring::write_entry(fd, offset, &data, 0);
        self.push(inner, entry, Op::Write { offset, data, done });
    }

    /// Tells the completion thread to stop once nothing is pending.
    pub(super) fn stop(&self) {
        // Refused only by a ring that has already failed, whose completion thread has ended.
        let _ = self.push_entry(opcode::Nop::new().build().user_data(STOP));
    }

    fn push(&self, inner: &dyn Target, entry: io_uring::squeue::Entry, op: Op) {
        let key = {
            let mut guard = self.pending.lock();
            let Some(pending) = guard.as_mut() else {
                drop(guard);
                let error = io::Error::other("the device's io_uring failed earlier");
                return fail(inner, op, &error, false);
            };
            let key = pending.0;
            pending.0 += 1;
            pending.1.insert(key, op);
            key
        };
        if let Err(error) = self.push_entry(entry.user_data(key)) {
            let op = self.pending.lock().as_mut().and_then(|p| p.1.remove(&key));
            if let Some(op) = op {
                fail(inner, op, &error, false);
            }
        }
    }

    /// Queues an entry and submits it; gives up when the queue stays full, which only a ring
    /// whose completions stopped can cause.
    fn push_entry(&self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        let _one_at_a_time = self.submit.lock();
        for _ in 0..PUSH_ATTEMPTS_MAX {
            // SAFETY: `submit` is held, so no other SubmissionQueue exists. The entry's buffer
            // (if any) is owned by the pending-op table until its completion is reaped.
            let pushed = unsafe { self.ring.submission_shared().push(&entry) };
            match self.ring.submitter().submit() {
                Ok(_) => {}
                // The kernel is short of resources or the completion queue is full: the
                // completion thread is draining it; submit again.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    thread::yield_now();
                }
                // Nothing else is expected from a ring that accepted its first submission; the
                // entry stays queued and goes in with the next submission or wait.
                Err(_) => {}
            }
            if pushed.is_ok() {
                return Ok(());
            }
        }
        Err(io::Error::other("the device's io_uring submission queue stayed full"))
    }

    fn complete_forever(&self, inner: &dyn Target) {
        let mut stopping = false;
        loop {
            if stopping && self.pending.lock().as_ref().is_none_or(|p| p.1.is_empty()) {
                return;
            }
            if let Err(e) = self.ring.submitter().submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                    // The ring is unusable: fail what is pending rather than hang its callers.
                    self.fail_all(inner, e);
                    return;
                }
            }
            // SAFETY: this thread is the only user of the completion queue.
            let reaped: Vec<(u64, i32)> = unsafe { self.ring.completion_shared() }
                .map(|cqe| (cqe.user_data(), cqe.result()))
                .collect();
            for (key, result) in reaped {
                if key == STOP {
                    stopping = true;
                    continue;
                }
                let op = self.pending.lock().as_mut().and_then(|p| p.1.remove(&key));
                let Some(op) = op else { continue };
                finish(inner, op, result);
            }
        }
    }

    fn fail_all(&self, inner: &dyn Target, error: io::Error) {
        // Taken under the lock, so no operation can be added after the drain and wait forever.
        let ops = self.pending.lock().take().map(|p| p.1).unwrap_or_default();
        for (_, op) in ops {
            fail(inner, op, &error, true);
        }
    }
}

/// Answers an operation the kernel never completed with `error`. When the kernel may still
/// hold it (`submitted`: the ring failed with it in flight), its buffer is leaked rather than
/// freed, since the kernel could still write into it.
fn fail(inner: &dyn Target, op: Op, error: &io::Error, submitted: bool) {
    let e = io::Error::new(error.kind(), error.to_string());
    match op {
        Op::Read { offset, buf, done } => {
            let len = buf.len() as u64;
            if submitted {
                std::mem::forget(buf);
            }
            let _ = done.send(Err(inner.error(DeviceOp::Read, offset, len, e)));
        }
        Op::Write { offset, data, done } => {
            let len = data.len() as u64;
            if submitted {
                std::mem::forget(data.clone());
            }
            let _ = done.send(Err(inner.error(DeviceOp::Write, offset, len, e)));
        }
    }
}

/// Answers a completed operation; short transfers and refused O_DIRECT are redone with the
/// blocking calls, which finish them or say why not.
fn finish(inner: &dyn Target, op: Op, result: i32) {
    match op {
        Op::Read { offset, buf, done } => {
            let _ = done.send(inner.complete_read(offset, buf, result));
        }
        Op::Write { offset, data, done } => {
            let _ = done.send(inner.complete_write(offset, &data, result));
        }
    }
}

/// The file name, for a thread name of at most 15 bytes.
fn short(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.chars().take(4).collect()
}
