//! File and block-device leaves (ZFS: `vdev_file.c`, `vdev_disk.c`).
//!
//! On a serving core (`device::core_ring`) reads, writes, durable (`RWF_DSYNC`) writes and
//! flushes go through that core's own ring, submitted and completed on the caller's thread.
//! Elsewhere reads and writes go through io_uring where the kernel offers it (`device::uring`):
//! the caller submits and a completion thread per device completes the engine's futures.
//! Otherwise, and for flushes and discards, a small pool of named I/O threads (`vdev_io/<n>`) runs blocking
//! `pread`/`pwrite`/`fdatasync`/discard calls and completes the futures through oneshot
//! channels. Either way no executor thread ever blocks on a disk (tokio's file I/O is a
//! blocking-pool hop we do not want on the commit path).
//!
//! O_DIRECT is used when the filesystem accepts it and the buffer, offset and length are aligned
//! to the device's logical block size; otherwise the I/O goes through a second, buffered
//! descriptor of the same file. A filesystem that accepts `open(O_DIRECT)` but refuses the I/O
//! itself (EINVAL) switches the device to buffered I/O for good, with no error surfaced. Flush is
//! `fdatasync`, which on Linux also flushes the drive's volatile cache. Discard punches a hole in
//! a regular file or issues BLKDISCARD to a block device; a device that cannot discard ignores
//! it, since discard is only a hint.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use crossbeam_channel::{bounded, Receiver, Sender};
use futures::channel::oneshot;
use futures::FutureExt;
use parking_lot::Mutex;

use super::core_ring;
use super::uring::{self, Uring};
use super::{
    check_range, AlignedBuf, BlockDevice, DeviceError, DeviceOp, SharedBuf, UninitBuf,
    BUF_ALIGN_BYTES,
};
use crate::rt::BoxFuture;

/// How many requests may wait for an I/O thread before submitters wait too. The leaf's queue
/// already bounds what it issues; this bound only keeps a misbehaving caller from growing memory.
const FILE_JOBS_QUEUED_MAX: usize = 4096;

/// `fallocate` mode that allocates written, zeroed extents (Linux 6.17; not yet in libc).
const FALLOC_FL_WRITE_ZEROES: libc::c_int = 0x80;

/// Allocates a new file's blocks (unwritten extents) so the filesystem cannot run out of room
/// under the pool later; a filesystem without fallocate leaves the file sparse.
fn preallocate(file: &File, len: u64) -> io::Result<()> {
    let Ok(len) = i64::try_from(len) else { return Ok(()) };
    // SAFETY: fallocate on an open descriptor with plain integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(()),
        _ => Err(error),
    }
}

// Linux block-device ioctls (linux/fs.h); the libc crate does not export all of them.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

/// How to open a file leaf.
#[derive(Clone, Debug)]
pub struct FileDeviceOptions {
    /// I/O threads for this leaf: how many device operations can be in the kernel at once
    /// without io_uring (with it, they run flushes and discards).
    pub io_threads: usize,
    /// Submit reads and writes through io_uring when the kernel allows it.
    pub io_uring: bool,
    /// Try O_DIRECT (bypass the page cache). Off, or refused, means buffered I/O.
    pub direct: bool,
    /// Create a regular file of this length when the path does not exist: allocated in full
    /// (`fallocate`), so the filesystem can never run out of room under the pool, unless
    /// `sparse`.
    pub create_len_bytes: Option<u64>,
    /// Create the file sparse (thin): blocks are allocated as they are first written.
    pub sparse: bool,
    /// Take an exclusive lock on the device for as long as it is open, so that two processes
    /// (or two pools in one process) never open the same leaf.
    pub exclusive: bool,
}

impl Default for FileDeviceOptions {
    fn default() -> Self {
        FileDeviceOptions {
            io_threads: 4,
            io_uring: true,
            direct: true,
            create_len_bytes: None,
            sparse: false,
            exclusive: false,
        }
    }
}

enum Job {
    Read {
        offset: u64,
        len: u32,
        done: oneshot::Sender<Result<AlignedBuf, DeviceError>>,
    },
    Write {
        offset: u64,
        data: SharedBuf,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    Flush {
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    /// A write, then a flush, on one thread: one trip instead of two.
    WriteFlush {
        offset: u64,
        data: SharedBuf,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    Discard {
        offset: u64,
        len: u64,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    PrepareLog {
        offset: u64,
        len: u64,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
}

pub(super) struct Inner {
    name: String,
    buffered: File,
    direct: Option<File>,
    direct_refused: AtomicBool,
    is_block_device: bool,
    len_bytes: u64,
    sector_bytes: u32,
    rotational: bool,
}

/// A regular file or block device used as a leaf.
pub struct FileDevice {
    inner: Arc<Inner>,
    jobs: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
    uring: Option<Arc<Uring>>,
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("name", &self.inner.name)
            .field("len_bytes", &self.inner.len_bytes)
            .field("direct", &self.uses_direct_io())
            .field("io_uring", &self.uring.is_some())
            .finish()
    }
}

impl FileDevice {
    /// Opens (or creates, sparse, when `create_len_bytes` is set) a file or block device.
    pub fn open(path: &Path, options: &FileDeviceOptions) -> Result<FileDevice, DeviceError> {
        let open_error =
            |source: io::Error| DeviceError::Open { path: path.to_owned(), cause: source };
        if !path.exists() {
            if let Some(len) = options.create_len_bytes {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(open_error)?;
                file.set_len(len).map_err(open_error)?;
                if !options.sparse {
                    preallocate(&file, len).map_err(open_error)?;
                }
            }
        }
        let buffered = OpenOptions::new().read(true).write(true).open(path).map_err(open_error)?;
        if options.exclusive {
            lock_exclusive(&buffered, path)?;
        }
        let metadata = buffered.metadata().map_err(open_error)?;
        let is_block_device = metadata.file_type().is_block_device();
        let (len_bytes, sector_bytes, rotational) = if is_block_device {
            let len = ioctl_u64(&buffered, BLKGETSIZE64).map_err(open_error)?;
            let sector = ioctl_u32(&buffered, BLKSSZGET).map_err(open_error)?;
            (len, sector, sysfs_rotational(metadata.rdev()))
        } else if metadata.is_file() {
            // Files are addressed in 512-byte sectors; O_DIRECT alignment is checked per I/O.
            (metadata.len(), 512, false)
        } else {
            return Err(open_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            )));
        };
        let direct = if options.direct {
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path).ok()
        } else {
            None
        };
        let inner = Arc::new(Inner {
            name: path.display().to_string(),
            buffered,
            direct,
            direct_refused: AtomicBool::new(false),
            is_block_device,
            len_bytes,
            sector_bytes,
            rotational,
        });
        let mut threads = Vec::new();
        // Refused (old kernel, seccomp): the I/O threads do everything.
        let uring = if options.io_uring {
            Uring::start(Arc::clone(&inner) as Arc<dyn uring::Target>, &inner.name).ok().map(
                |(uring, handle)| {
                    threads.push(handle);
                    uring
                },
            )
        } else {
            None
        };
        let io_threads = options.io_threads.max(1);
        let (sender, receiver) = bounded(FILE_JOBS_QUEUED_MAX);
        for index in 0..io_threads {
            let inner = Arc::clone(&inner);
            let receiver = receiver.clone();
            let handle = thread::Builder::new()
                .name(format!("vdev_io/{index}"))
                .spawn(move || io_thread(&inner, &receiver))
                .map_err(open_error)?;
            threads.push(handle);
        }
        Ok(FileDevice {
            inner,
            jobs: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
            uring,
        })
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.inner.name)
    }

    /// Whether reads and writes are submitted through io_uring.
    pub fn uses_io_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Whether reads and writes currently bypass the page cache.
    pub fn uses_direct_io(&self) -> bool {
        self.inner.direct.is_some() && !self.inner.direct_refused.load(Ordering::Relaxed)
    }

    fn submit<T: Send + 'static>(
        &self,
        op: DeviceOp,
        offset: u64,
        len: u64,
        job: impl FnOnce(oneshot::Sender<Result<T, DeviceError>>) -> Job,
    ) -> BoxFuture<Result<T, DeviceError>> {
        let (done, wait) = oneshot::channel();
        let sent = self.jobs.lock().as_ref().map(|jobs| jobs.send(job(done)));
        if !matches!(sent, Some(Ok(()))) {
            let name = self.inner.name.clone();
            return async move { Err(DeviceError::Gone { device: name }) }.boxed();
        }
        self.answer(wait, op, offset, len)
    }

    /// Waits for the thread that holds the operation to answer.
    fn answer<T: Send + 'static>(
        &self,
        wait: oneshot::Receiver<Result<T, DeviceError>>,
        op: DeviceOp,
        offset: u64,
        len: u64,
    ) -> BoxFuture<Result<T, DeviceError>> {
        let name = self.inner.name.clone();
        async move {
            match wait.await {
                Ok(result) => result,
                // The thread died mid-request: treat the device as gone.
                Err(_) => Err(DeviceError::Io {
                    device: name,
                    op,
                    offset_bytes: offset,
                    len_bytes: len,
                    cause: io::Error::other("I/O thread exited"),
                }),
            }
        }
        .boxed()
    }

    /// A read on this thread's serving-core ring, if it has one (`device::core_ring`). A short
    /// read or a refused O_DIRECT is finished with the blocking call on the core: rare, and
    /// cheaper than a second path through the ring.
    fn core_read(
        &self,
        offset: u64,
        len: u32,
    ) -> Option<BoxFuture<Result<AlignedBuf, DeviceError>>> {
        self.uring.as_ref()?;
        // The ring reads into a fresh buffer, which is always aligned: offset and length decide.
        let aligned = std::ptr::without_provenance::<u8>(BUF_ALIGN_BYTES);
        let fd = self.inner.fd_for(offset, len as usize, aligned);
        let op = core_ring::read(fd, self.inner.clone(), offset, len)?;
        let inner = Arc::clone(&self.inner);
        Some(
            async move {
                let outcome = op.await;
                match outcome.buf {
                    Some(buf) => inner.complete_read(offset, buf, outcome.result),
                    // Only a ring that failed before taking the read answers without its buffer.
                    None => Err(inner.error(
                        DeviceOp::Read,
                        offset,
                        u64::from(len),
                        io::Error::from_raw_os_error(-outcome.result),
                    )),
                }
            }
            .boxed(),
        )
    }

    /// A write on this thread's serving-core ring, if it has one; with `dsync` durable when it
    /// completes (`RWF_DSYNC`).
    fn core_write(
        &self,
        offset: u64,
        data: &SharedBuf,
        dsync: bool,
    ) -> Option<BoxFuture<Result<(), DeviceError>>> {
        self.uring.as_ref()?;
        let fd = self.inner.fd_for_write(offset, data);
        let op = core_ring::write(fd, self.inner.clone(), offset, data.clone(), dsync)?;
        let inner = Arc::clone(&self.inner);
        let data = data.clone();
        Some(
            async move {
                let result = op.await.result;
                inner.complete_write(offset, &data, result)?;
                let redone = usize::try_from(result).ok() != Some(data.len());
                if dsync && redone {
                    // Redone with the blocking call, which did not make it durable.
                    inner
                        .buffered
                        .sync_data()
                        .map_err(|e| inner.error(DeviceOp::Flush, 0, 0, e))?;
                }
                Ok(())
            }
            .boxed(),
        )
    }

    fn check(&self, op: DeviceOp, offset: u64, len: u64) -> Result<(), DeviceError> {
        let inner = &self.inner;
        check_range(&inner.name, op, offset, len, inner.len_bytes, inner.sector_bytes)
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        // Closing the channel ends the I/O threads once they finish what they hold, and the
        // completion thread stops once nothing is pending; waiting for them closes the file, so
        // the device's lock is released when the device is dropped.
        self.jobs.lock().take();
        if let Some(uring) = &self.uring {
            uring.stop();
        }
        for handle in self.threads.lock().drain(..) {
            let _ = handle.join();
        }
    }
}

impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes
    }

    fn sector_bytes(&self) -> u32 {
        self.inner.sector_bytes
    }

    fn is_rotational(&self) -> bool {
        self.inner.rotational
    }

    fn parallel_flushes(&self) -> bool {
        self.inner.is_block_device && !self.inner.rotational
    }

    fn read_at(&self, offset: u64, len: u32) -> BoxFuture<Result<AlignedBuf, DeviceError>> {
        if let Err(error) = self.check(DeviceOp::Read, offset, u64::from(len)) {
            return async move { Err(error) }.boxed();
        }
        if let Some(op) = self.core_read(offset, len) {
            return op;
        }
        if let Some(uring) = &self.uring {
            let (done, wait) = oneshot::channel();
            uring.read(&*self.inner, offset, len, done);
            return self.answer(wait, DeviceOp::Read, offset, u64::from(len));
        }
        self.submit(DeviceOp::Read, offset, u64::from(len), |done| Job::Read { offset, len, done })
    }

    fn write_at(&self, offset: u64, data: SharedBuf) -> BoxFuture<Result<(), DeviceError>> {
        let len = u64::from(data.len_bytes());
        if let Err(error) = self.check(DeviceOp::Write, offset, len) {
            return async move { Err(error) }.boxed();
        }
        if let Some(op) = self.core_write(offset, &data, false) {
            return op;
        }
        if let Some(uring) = &self.uring {
            let (done, wait) = oneshot::channel();
            uring.write(&*self.inner, offset, data, done);
            return self.answer(wait, DeviceOp::Write, offset, len);
        }
        self.submit(DeviceOp::Write, offset, len, |done| Job::Write { offset, data, done })
    }

    fn flush(&self) -> BoxFuture<Result<(), DeviceError>> {
        // On a serving core the ring runs it (on a kernel worker; no user-space thread between
        // the core and the disk). Elsewhere on an I/O thread even with io_uring (device::uring).
        if self.uring.is_some() {
            let fd = self.inner.buffered.as_raw_fd();
            if let Some(op) = core_ring::fdatasync(fd, self.inner.clone()) {
                let inner = Arc::clone(&self.inner);
                return async move {
                    let outcome = op.await;
                    if outcome.result < 0 {
                        let error = io::Error::from_raw_os_error(-outcome.result);
                        return Err(inner.error(DeviceOp::Flush, 0, 0, error));
                    }
                    Ok(())
                }
                .boxed();
            }
        }
        self.submit(DeviceOp::Flush, 0, 0, |done| Job::Flush { done })
    }

    fn write_durable_at(
        &self,
        offset: u64,
        data: SharedBuf,
    ) -> Option<BoxFuture<Result<(), DeviceError>>> {
        let len = u64::from(data.len_bytes());
        if let Err(error) = self.check(DeviceOp::Write, offset, len) {
            return Some(async move { Err(error) }.boxed());
        }
        if let Some(op) = self.core_write(offset, &data, true) {
            return Some(op);
        }
        Some(self.submit(DeviceOp::Write, offset, len, |done| Job::WriteFlush {
            offset,
            data,
            done,
        }))
    }

    fn prepare_log_region(&self, offset: u64, len: u64) -> BoxFuture<Result<(), DeviceError>> {
        if let Err(error) = self.check(DeviceOp::Write, offset, len) {
            return async move { Err(error) }.boxed();
        }
        self.submit(DeviceOp::Write, offset, len, |done| Job::PrepareLog { offset, len, done })
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFuture<Result<(), DeviceError>> {
        if let Err(error) = self.check(DeviceOp::Discard, offset, len) {
            return async move { Err(error) }.boxed();
        }
        self.submit(DeviceOp::Discard, offset, len, |done| Job::Discard { offset, len, done })
    }
}

fn io_thread(inner: &Inner, receiver: &Receiver<Job>) {
    // Every thread waits on the channel itself, so a job wakes one thread. (Behind a shared
    // mutex, as before, the thread that took a job woke the next one to wait in its place:
    // two wake-ups per job, measured with strace on 1-job sync writes.)
    loop {
        let Ok(job) = receiver.recv() else { return };
        // A dropped receiver means the caller gave up waiting; the result is simply discarded.
        match job {
            Job::Read { offset, len, done } => {
                let _ = done.send(inner.read(offset, len));
            }
            Job::Write { offset, data, done } => {
                let _ = done.send(inner.write(offset, &data));
            }
            Job::Flush { done } => {
                let result = inner.buffered.sync_data();
                let _ = done.send(result.map_err(|e| inner.error(DeviceOp::Flush, 0, 0, e)));
            }
            Job::WriteFlush { offset, data, done } => {
                let result = inner.write(offset, &data).and_then(|()| {
                    inner.buffered.sync_data().map_err(|e| inner.error(DeviceOp::Flush, 0, 0, e))
                });
                let _ = done.send(result);
            }
            Job::Discard { offset, len, done } => {
                let _ = done.send(inner.discard(offset, len));
            }
            Job::PrepareLog { offset, len, done } => {
                let _ = done.send(inner.prepare_log_region(offset, len));
            }
        }
    }
}

impl uring::Target for Inner {
    fn fd_for(&self, offset: u64, len: usize, addr: *const u8) -> std::os::fd::RawFd {
        Inner::fd_for(self, offset, len, addr)
    }

    fn fd_for_write(&self, offset: u64, data: &SharedBuf) -> std::os::fd::RawFd {
        Inner::fd_for_write(self, offset, data)
    }

    fn error(&self, op: DeviceOp, offset: u64, len: u64, source: io::Error) -> DeviceError {
        Inner::error(self, op, offset, len, source)
    }

    fn complete_read(
        &self,
        offset: u64,
        buf: UninitBuf,
        result: i32,
    ) -> Result<AlignedBuf, DeviceError> {
        Inner::complete_read(self, offset, buf, result)
    }

    fn complete_write(
        &self,
        offset: u64,
        data: &SharedBuf,
        result: i32,
    ) -> Result<(), DeviceError> {
        Inner::complete_write(self, offset, data, result)
    }
}

impl Inner {
    pub(super) fn error(
        &self,
        op: DeviceOp,
        offset: u64,
        len: u64,
        source: io::Error,
    ) -> DeviceError {
        if source.raw_os_error() == Some(libc::ENOSPC) && !self.is_block_device {
            // A thin file whose filesystem filled: say which filesystem, so the person who
            // reads it knows where to free space.
            return DeviceError::HostFull {
                device: self.name.clone(),
                filesystem: mount_point(Path::new(&self.name)),
                op,
                offset_bytes: offset,
                len_bytes: len,
            };
        }
        DeviceError::Io {
            device: self.name.clone(),
            op,
            offset_bytes: offset,
            len_bytes: len,
            cause: source,
        }
    }

    /// The O_DIRECT descriptor, if this I/O may use it.
    fn direct_for(&self, offset: u64, len: usize, addr: *const u8) -> Option<&File> {
        let align = u64::from(self.sector_bytes.max(512));
        let aligned = offset % align == 0
            && (len as u64) % align == 0
            && (addr as usize) % BUF_ALIGN_BYTES == 0;
        if aligned && !self.direct_refused.load(Ordering::Relaxed) {
            self.direct.as_ref()
        } else {
            None
        }
    }

    /// The descriptor an I/O of this shape should use: O_DIRECT when allowed and aligned.
    pub(super) fn fd_for(&self, offset: u64, len: usize, addr: *const u8) -> std::os::fd::RawFd {
        match self.direct_for(offset, len, addr) {
            Some(direct) => direct.as_raw_fd(),
            None => self.buffered.as_raw_fd(),
        }
    }

    /// [`Inner::fd_for`] for a write of `data`, whole or in pieces (each piece starts aligned;
    /// O_DIRECT also needs each one's length aligned).
    pub(super) fn fd_for_write(&self, offset: u64, data: &SharedBuf) -> std::os::fd::RawFd {
        let align = self.sector_bytes.max(512) as usize;
        if data.pieces_multiple_of(align) {
            self.fd_for(offset, data.len(), data.addr())
        } else {
            self.buffered.as_raw_fd()
        }
    }

    /// The answer to a read the kernel completed with `result` (bytes, or a negative errno): a
    /// short read, or O_DIRECT refused (EINVAL, which switches the device to buffered I/O), is
    /// redone with the blocking call, which finishes it or says why not.
    pub(super) fn complete_read(
        &self,
        offset: u64,
        buf: UninitBuf,
        result: i32,
    ) -> Result<AlignedBuf, DeviceError> {
        let len = buf.len();
        if result >= 0 && result as usize == len {
            // SAFETY: the kernel reported every byte of the buffer read into it.
            return Ok(unsafe { buf.into_filled(len) });
        }
        // Anything less drops the buffer unread: a short read is redone below whole.
        if result < 0 && result != -libc::EINVAL {
            let error = io::Error::from_raw_os_error(-result);
            return Err(self.error(DeviceOp::Read, offset, len as u64, error));
        }
        if result == -libc::EINVAL {
            self.refuse_direct();
        }
        self.read(offset, len as u32)
    }

    /// [`Inner::complete_read`] for a write.
    pub(super) fn complete_write(
        &self,
        offset: u64,
        data: &SharedBuf,
        result: i32,
    ) -> Result<(), DeviceError> {
        if result >= 0 && result as usize == data.len() {
            return Ok(());
        }
        if result < 0 && result != -libc::EINVAL {
            let error = io::Error::from_raw_os_error(-result);
            return Err(self.error(DeviceOp::Write, offset, data.len() as u64, error));
        }
        if result == -libc::EINVAL {
            self.refuse_direct();
        }
        self.write(offset, data)
    }

    /// The filesystem accepted O_DIRECT at open but refused an I/O: buffered from now on.
    pub(super) fn refuse_direct(&self) {
        self.direct_refused.store(true, Ordering::Relaxed);
    }

    pub(super) fn read(&self, offset: u64, len: u32) -> Result<AlignedBuf, DeviceError> {
        let mut buf = AlignedBuf::zeroed(len as usize);
        if let Some(direct) = self.direct_for(offset, buf.len(), buf.as_ptr()) {
            match direct.read_exact_at(&mut buf, offset) {
                Ok(()) => return Ok(buf),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(self.error(DeviceOp::Read, offset, u64::from(len), e)),
            }
        }
        self.buffered
            .read_exact_at(&mut buf, offset)
            .map_err(|e| self.error(DeviceOp::Read, offset, u64::from(len), e))?;
        Ok(buf)
    }

    pub(super) fn write(&self, offset: u64, data: &SharedBuf) -> Result<(), DeviceError> {
        let len = u64::from(data.len_bytes());
        if let Some(direct) = self.direct_for(offset, data.len(), data.as_ptr()) {
            match direct.write_all_at(data, offset) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(self.error(DeviceOp::Write, offset, len, e)),
            }
        }
        self.buffered
            .write_all_at(data, offset)
            .map_err(|e| self.error(DeviceOp::Write, offset, len, e))
    }

    /// Writes zeros over a range of a regular file (block devices have no extents to
    /// prepare), then makes the file's new extents durable. Linux 6.17's
    /// `FALLOC_FL_WRITE_ZEROES` does it without moving the bytes where the device can; else
    /// zeros are written a MiB at a time.
    fn prepare_log_region(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if self.is_block_device {
            return Ok(());
        }
        let error = |e: io::Error| self.error(DeviceOp::Write, offset, len, e);
        let (Ok(off), Ok(length)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(error(io::Error::from(io::ErrorKind::InvalidInput)));
        };
        // SAFETY: fallocate on an open descriptor with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(self.buffered.as_raw_fd(), FALLOC_FL_WRITE_ZEROES, off, length)
        };
        if rc != 0 {
            const PIECE: u64 = 1 << 20;
            let zeros = AlignedBuf::zeroed(PIECE.min(len) as usize).into_shared();
            let mut at = offset;
            while at < offset + len {
                let n = PIECE.min(offset + len - at);
                let piece = if n == zeros.len() as u64 {
                    zeros.clone()
                } else {
                    AlignedBuf::zeroed(n as usize).into_shared()
                };
                self.write(at, &piece)?;
                at += n;
            }
        }
        self.buffered.sync_all().map_err(error)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let fd = self.buffered.as_raw_fd();
        let result = if self.is_block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads a [u64; 2] (start, length) that lives across the call.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            let (Ok(off), Ok(length)) = (i64::try_from(offset), i64::try_from(len)) else {
                return Err(self.error(
                    DeviceOp::Discard,
                    offset,
                    len,
                    io::Error::from(io::ErrorKind::InvalidInput),
                ));
            };
            // SAFETY: fallocate on an open descriptor with plain integer arguments.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    length,
                )
            }
        };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            // Discard is a hint: a filesystem or device without support simply keeps the data.
            Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => Ok(()),
            _ => Err(self.error(DeviceOp::Discard, offset, len, error)),
        }
    }
}

/// The mount point of the filesystem holding `path`: its highest ancestor on the same device
/// (`st_dev`). The path itself, absolute, if it cannot be looked at.
fn mount_point(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Ok(device) = std::fs::metadata(&path).map(|m| m.dev()) else {
        return path.display().to_string();
    };
    let mut top = path.as_path();
    while let Some(parent) = top.parent() {
        match std::fs::metadata(parent) {
            Ok(meta) if meta.dev() == device => top = parent,
            _ => break,
        }
    }
    top.display().to_string()
}

/// The exclusive lock could not be taken, and not because someone else holds it: the
/// filesystem under the leaf refused both kinds of lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    #[error(
        "the exclusive lock on {path} failed: fcntl(F_OFD_SETLK) answered {ofd} and \
         flock(LOCK_EX|LOCK_NB) answered {flock}, so the filesystem holding it does not lock \
         files; put the leaf on a local filesystem (ext4, xfs, btrfs, tmpfs) or one that locks \
         (NFS mounted without `nolock`)"
    )]
    Refused { path: PathBuf, ofd: Errno, flock: Errno },
}

/// An errno, shown by name and meaning ("EINVAL (Invalid argument)").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    fn of(error: &io::Error) -> Errno {
        Errno(error.raw_os_error().unwrap_or(0))
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            libc::EINVAL => "EINVAL",
            libc::ENOLCK => "ENOLCK",
            libc::EOPNOTSUPP => "EOPNOTSUPP",
            libc::ENOSYS => "ENOSYS",
            libc::EBADF => "EBADF",
            libc::EPERM => "EPERM",
            libc::EACCES => "EACCES",
            libc::EAGAIN => "EAGAIN",
            libc::EINTR => "EINTR",
            libc::EIO => "EIO",
            _ => return write!(f, "{}", io::Error::from_raw_os_error(self.0)),
        };
        let text = io::Error::from_raw_os_error(self.0).to_string();
        let suffix = format!(" (os error {})", self.0);
        write!(f, "{name} ({})", text.strip_suffix(&suffix).unwrap_or(&text))
    }
}

/// The two lock calls, behind a seam so tests can make them fail the way a filesystem without
/// locks does.
struct LockCalls {
    ofd: fn(std::os::fd::RawFd) -> io::Result<()>,
    flock: fn(std::os::fd::RawFd) -> io::Result<()>,
}

const SYSTEM_LOCKS: LockCalls = LockCalls { ofd: ofd_lock, flock: flock_lock };

/// Takes an exclusive lock on the whole file: an open-file-description write lock, or, where
/// the filesystem refuses those (EINVAL, ENOLCK, EOPNOTSUPP: some FUSE and network
/// filesystems), a `flock`. Both belong to this open file, not to the process, so a second open
/// in the same process conflicts too, and the lock goes away when the device is dropped or the
/// process dies. The two kinds do not see each other, but a filesystem that refuses OFD locks
/// refuses them to every process, so all of them fall back alike.
fn lock_exclusive(file: &File, path: &Path) -> Result<(), DeviceError> {
    lock_with(file, path, &SYSTEM_LOCKS)
}

fn lock_with(file: &File, path: &Path, calls: &LockCalls) -> Result<(), DeviceError> {
    let fd = file.as_raw_fd();
    let ofd = match (calls.ofd)(fd) {
        Ok(()) => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
            return Err(locked(file, path));
        }
        Err(e) => e,
    };
    match (calls.flock)(fd) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(locked(file, path)),
        Err(flock) => {
            let refused = LockError::Refused {
                path: path.to_owned(),
                ofd: Errno::of(&ofd),
                flock: Errno::of(&flock),
            };
            Err(DeviceError::Open { path: path.to_owned(), cause: io::Error::other(refused) })
        }
    }
}

/// Another open file holds the lock: says who, when /proc tells.
fn locked(file: &File, path: &Path) -> DeviceError {
    let holder = file
        .metadata()
        .ok()
        .and_then(|m| lock_holder(m.dev(), m.ino()))
        .unwrap_or_else(|| "another process".to_owned());
    DeviceError::Locked { path: path.to_owned(), holder }
}

fn ofd_lock(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: flock is a plain C struct; all-zero is a valid value that we then fill in.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_OFD_SETLK reads the flock struct, which outlives the call.
    let result = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &lock as *const libc::flock) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn flock_lock(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: flock on an open descriptor with plain integer arguments.
    let result = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Names a process that has the file with this device and inode open, from /proc/*/fd.
/// (For open-file-description locks /proc/locks shows no pid, so the open files are the only
/// trace of the holder.) Prefers another process over this one.
fn lock_holder(dev: u64, ino: u64) -> Option<String> {
    let me = std::process::id();
    let mut found: Option<u32> = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino));
        if holds {
            found = Some(pid);
            if pid != me {
                break;
            }
        }
    }
    let pid = found?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok().map(|raw| {
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    });
    Some(match command {
        Some(command) if !command.is_empty() => format!("process {pid} ({command})"),
        _ => format!("process {pid}"),
    })
}

fn ioctl_u64(file: &File, request: libc::c_ulong) -> io::Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: the request writes one u64 into `value`, which outlives the call.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), request, &mut value as *mut u64) };
    if result == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn ioctl_u32(file: &File, request: libc::c_ulong) -> io::Result<u32> {
    let mut value: libc::c_int = 0;
    // SAFETY: the request writes one int into `value`, which outlives the call.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), request, &mut value as *mut libc::c_int) };
    if result == 0 {
        u32::try_from(value).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads `/sys/dev/block/MAJ:MIN/queue/rotational`; unknown means rotational, the cautious guess
/// (it only makes the scheduler keep requests in offset order).
fn sysfs_rotational(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let path = format!("/sys/dev/block/{major}:{minor}/queue/rotational");
    std::fs::read_to_string(path).map(|s| s.trim() != "0").unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn open_with(path: &Path, len: u64, io_uring: bool) -> FileDevice {
        let options =
            FileDeviceOptions { create_len_bytes: Some(len), io_uring, ..Default::default() };
        FileDevice::open(path, &options).unwrap()
    }

    /// Aligned and unaligned writes read back intact, and flush succeeds.
    fn round_trip(io_uring: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf0");
        let device = open_with(&path, 1 << 20, io_uring);
        assert!(io_uring || !device.uses_io_uring());
        // Which path ran shows in the test output (a sandbox may refuse io_uring).
        eprintln!("io_uring asked {io_uring}, used {}", device.uses_io_uring());
        assert_eq!(device.len_bytes(), 1 << 20);
        let aligned = pattern(8192, 1);
        block_on(device.write_at(4096, SharedBuf::copy_from(&aligned))).unwrap();
        // 512-byte granularity: offset and length not 4 KiB aligned; takes the buffered path.
        let small = pattern(1536, 2);
        block_on(device.write_at(512, SharedBuf::copy_from(&small))).unwrap();
        block_on(device.flush()).unwrap();
        assert_eq!(&block_on(device.read_at(4096, 8192)).unwrap()[..], &aligned[..]);
        assert_eq!(&block_on(device.read_at(512, 1536)).unwrap()[..], &small[..]);
        // A write and its flush in one trip (intent-log blocks); out of range is still refused.
        let durable = pattern(4096, 3);
        let fused = device.write_durable_at(65536, SharedBuf::copy_from(&durable)).unwrap();
        block_on(fused).unwrap();
        assert_eq!(&block_on(device.read_at(65536, 4096)).unwrap()[..], &durable[..]);
        let outside = device.write_durable_at(1 << 20, SharedBuf::copy_from(&durable)).unwrap();
        assert!(matches!(block_on(outside), Err(DeviceError::OutOfRange { .. })));
    }

    /// A buffer of pieces is written as their bytes back to back, whether the kernel takes
    /// the pieces (io_uring's vectored write), or the I/O threads write it joined; a durable
    /// write of pieces too; pieces of part sectors go through the buffered descriptor.
    fn pieces_round_trip(io_uring: bool) {
        let dir = tempfile::tempdir().unwrap();
        let device = open_with(&dir.path().join("leaf5"), 1 << 20, io_uring);
        let parts = [pattern(16384, 1), pattern(4096, 2), pattern(16384, 3)];
        let pieces = || -> Vec<Arc<AlignedBuf>> {
            parts.iter().map(|p| Arc::new(AlignedBuf::copy_from(p))).collect()
        };
        let all: Vec<u8> = parts.concat();
        let data = SharedBuf::gather(pieces());
        block_on(device.write_at(8192, data.clone())).unwrap();
        assert!(!io_uring || data.iovecs().is_some(), "written without joining the pieces");
        assert_eq!(&block_on(device.read_at(8192, all.len() as u32)).unwrap()[..], &all[..]);
        let fused = device.write_durable_at(131072, SharedBuf::gather(pieces())).unwrap();
        block_on(fused).unwrap();
        assert_eq!(&block_on(device.read_at(131072, all.len() as u32)).unwrap()[..], &all[..]);
        let odd = [pattern(512, 4), pattern(1024, 5)];
        let odd_pieces = odd.iter().map(|p| Arc::new(AlignedBuf::copy_from(p))).collect();
        block_on(device.write_at(262144, SharedBuf::gather(odd_pieces))).unwrap();
        assert_eq!(&block_on(device.read_at(262144, 1536)).unwrap()[..], &odd.concat()[..]);
    }

    #[test]
    fn pieces_round_trip_io_uring() {
        pieces_round_trip(true);
    }

    #[test]
    fn pieces_round_trip_io_threads() {
        pieces_round_trip(false);
    }

    #[test]
    fn write_read_flush_round_trip_io_uring() {
        round_trip(true);
    }

    #[test]
    fn write_read_flush_round_trip_io_threads() {
        round_trip(false);
    }

    /// Many reads and writes in flight at once each get their own answer: 128 writes of
    /// different patterns, then 128 reads, all submitted before any is awaited, against the
    /// same device reopened, through the ring and through the threads alike.
    fn many_in_flight(io_uring: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf4");
        let device = open_with(&path, 4 << 20, io_uring);
        let writes: Vec<_> = (0..128u64)
            .map(|i| device.write_at(i * 16384, SharedBuf::copy_from(&pattern(16384, i as u8))))
            .collect();
        for result in block_on(futures::future::join_all(writes)) {
            result.unwrap();
        }
        block_on(device.flush()).unwrap();
        drop(device);
        let device = open_with(&path, 4 << 20, io_uring);
        let reads: Vec<_> = (0..128u64).map(|i| device.read_at(i * 16384, 16384)).collect();
        for (i, got) in block_on(futures::future::join_all(reads)).into_iter().enumerate() {
            assert!(got.unwrap()[..] == pattern(16384, i as u8)[..], "block {i}");
        }
    }

    #[test]
    fn many_in_flight_io_uring() {
        many_in_flight(true);
    }

    #[test]
    fn many_in_flight_io_threads() {
        many_in_flight(false);
    }

    /// Requests outside the device or off sector boundaries are refused with their range named.
    #[test]
    fn out_of_range_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf1");
        let options = FileDeviceOptions { create_len_bytes: Some(65536), ..Default::default() };
        let device = FileDevice::open(&path, &options).unwrap();
        let error = block_on(device.read_at(65536, 512)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("leaf1") && message.contains("65536"), "{message}");
        assert!(matches!(block_on(device.read_at(100, 512)), Err(DeviceError::OutOfRange { .. })));
        assert!(matches!(
            block_on(device.write_at(u64::MAX - 511, SharedBuf::copy_from(&[0; 512]))),
            Err(DeviceError::OutOfRange { .. })
        ));
    }

    /// Discard punches a hole: the range reads back as zeros and the file stays its length.
    #[test]
    fn discard_punches_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf2");
        let options = FileDeviceOptions { create_len_bytes: Some(1 << 20), ..Default::default() };
        let device = FileDevice::open(&path, &options).unwrap();
        block_on(device.write_at(0, SharedBuf::copy_from(&pattern(65536, 3)))).unwrap();
        block_on(device.discard(0, 65536)).unwrap();
        let back = block_on(device.read_at(0, 65536)).unwrap();
        // A filesystem without hole punching keeps the data; both are allowed by the contract,
        // but every filesystem CI runs on (ext4, xfs, tmpfs) punches.
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    }

    /// A second exclusive open is refused, naming the holder; the lock ends with the device.
    #[test]
    fn exclusive_opens_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf3");
        let options = FileDeviceOptions {
            create_len_bytes: Some(1 << 20),
            exclusive: true,
            ..Default::default()
        };
        let first = FileDevice::open(&path, &options).unwrap();
        let error = FileDevice::open(&path, &options).unwrap_err();
        assert!(matches!(error, DeviceError::Locked { .. }), "{error}");
        assert!(error.to_string().contains(&format!("process {}", std::process::id())), "{error}");
        drop(first);
        FileDevice::open(&path, &options).unwrap();
    }

    fn fails_with(code: i32) -> fn(std::os::fd::RawFd) -> io::Result<()> {
        match code {
            libc::EINVAL => |_| Err(io::Error::from_raw_os_error(libc::EINVAL)),
            libc::ENOLCK => |_| Err(io::Error::from_raw_os_error(libc::ENOLCK)),
            libc::EWOULDBLOCK => |_| Err(io::Error::from_raw_os_error(libc::EWOULDBLOCK)),
            _ => unreachable!("no stand-in for errno {code}"),
        }
    }

    fn lock_file(dir: &Path) -> (PathBuf, File) {
        let path = dir.join("leaf5");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        (path, file)
    }

    /// Where OFD locks are refused, the lock falls back to flock, which still keeps a second
    /// open out (flock locks belong to the open file too) and names who holds it.
    #[test]
    fn refused_ofd_lock_falls_back_to_flock() {
        let dir = tempfile::tempdir().unwrap();
        let (path, first) = lock_file(dir.path());
        let no_ofd = LockCalls { ofd: fails_with(libc::EINVAL), flock: flock_lock };
        lock_with(&first, &path, &no_ofd).unwrap();
        let second = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let error = lock_with(&second, &path, &no_ofd).unwrap_err();
        assert!(matches!(error, DeviceError::Locked { .. }), "{error}");
        assert!(error.to_string().contains(&format!("process {}", std::process::id())), "{error}");
        drop(first);
        lock_with(&second, &path, &no_ofd).unwrap();
    }

    /// When both kinds of lock are refused, the error says the lock failed, on which path, with
    /// which errno from each call, and what to do; it is not called a conflict.
    #[test]
    fn refused_locks_say_why_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = lock_file(dir.path());
        let none = LockCalls { ofd: fails_with(libc::EINVAL), flock: fails_with(libc::ENOLCK) };
        let error = lock_with(&file, &path, &none).unwrap_err();
        assert!(matches!(error, DeviceError::Open { .. }), "{error}");
        let message = error.to_string();
        for part in [
            "exclusive lock on",
            path.to_str().unwrap(),
            "F_OFD_SETLK) answered EINVAL (Invalid argument)",
            "answered ENOLCK (No locks available)",
            "local filesystem",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        // A conflict reported by flock is still a conflict.
        let busy =
            LockCalls { ofd: fails_with(libc::EINVAL), flock: fails_with(libc::EWOULDBLOCK) };
        let error = lock_with(&file, &path, &busy).unwrap_err();
        assert!(matches!(error, DeviceError::Locked { .. }), "{error}");
    }

    /// A missing file without a create length is an open error that names the path.
    #[test]
    fn missing_file_names_path() {
        let error =
            FileDevice::open(Path::new("/nonexistent/leafX"), &FileDeviceOptions::default())
                .unwrap_err();
        assert!(error.to_string().contains("/nonexistent/leafX"));
    }
}
