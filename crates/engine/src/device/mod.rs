//! Block devices: the seam between the engine and storage (ZFS: `vdev_file.c`, `vdev_disk.c`).
//!
//! Everything the engine stores goes through [`BlockDevice`]: read, write, flush, discard and
//! length. [`FileDevice`] serves regular files and block devices with per-leaf I/O threads;
//! `SimDevice` (built with the `testing` feature) models HDDs and SSDs with a volatile write
//! cache, crash images and injected faults, in virtual or real time. Tests and benchmarks swap
//! one for the other.
//!
//! Contract every implementation keeps: a write that completed is visible to later reads; it is
//! durable only after a later `flush` completed; nothing else is a barrier. Offsets and lengths
//! are checked against the device length and sector size before any I/O is attempted.

mod buf;
pub mod core_ring;
mod file;
pub mod inject;
// The simulated disks of the simulator, the benchmarks and the tests: not in the served binary.
#[cfg(feature = "testing")]
pub mod sim;
mod uring;

use std::io;
use std::path::PathBuf;

pub use buf::{AlignedBuf, SharedBuf, UninitBuf, BUF_ALIGN_BYTES, IOVECS_MAX};
pub use file::{FileDevice, FileDeviceOptions};
#[cfg(feature = "testing")]
pub use sim::{SimDevice, SimProfile};

use crate::rt::BoxFuture;

/// What a device operation was, for errors and traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    Open,
    Read,
    Write,
    Flush,
    Discard,
}

impl std::fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            DeviceOp::Open => "open",
            DeviceOp::Read => "read",
            DeviceOp::Write => "write",
            DeviceOp::Flush => "flush",
            DeviceOp::Discard => "discard",
        };
        f.write_str(name)
    }
}

/// A device operation failed. Carries the device, the operation and the range it covered so a
/// person can find the failing disk and sector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("device {device}: {op} of {len_bytes} bytes at offset {offset_bytes} failed: {cause}")]
    Io { device: String, op: DeviceOp, offset_bytes: u64, len_bytes: u64, cause: io::Error },
    #[error(
        "device {device}: {op} of {len_bytes} bytes at offset {offset_bytes} is outside the \
         device ({device_bytes} bytes) or not aligned to its {sector_bytes}-byte sectors"
    )]
    OutOfRange {
        device: String,
        op: DeviceOp,
        offset_bytes: u64,
        len_bytes: u64,
        device_bytes: u64,
        sector_bytes: u32,
    },
    #[error("device {path}: cannot open: {cause}; check the path exists and is readable/writable")]
    Open { path: PathBuf, cause: io::Error },
    #[error(
        "device {device}: the filesystem holding it ({filesystem}) is full: a {op} of \
         {len_bytes} bytes at offset {offset_bytes} was refused (ENOSPC). A thin (sparse) leaf \
         takes space there as the pool writes; free space on {filesystem}, or move the leaf to \
         a filesystem with room"
    )]
    HostFull {
        device: String,
        /// The mount point of the filesystem holding the leaf's file.
        filesystem: String,
        op: DeviceOp,
        offset_bytes: u64,
        len_bytes: u64,
    },
    #[error("device {device} is gone (removed or failed); its mirror runs degraded")]
    Gone { device: String },
    #[error(
        "device {path} is in use by {holder}; stop that process or export the pool there first"
    )]
    Locked { path: PathBuf, holder: String },
}

impl DeviceError {
    /// True when the error says the device as a whole is unusable, not just one range.
    pub fn is_gone(&self) -> bool {
        matches!(self, DeviceError::Gone { .. })
    }
}

/// A block device. Methods return boxed futures so the trait stays object-safe: the vdev tree
/// holds `Arc<dyn BlockDevice>` of mixed kinds (a mirror may pair a file with a simulated disk).
pub trait BlockDevice: Send + Sync + 'static {
    /// Path or name, for errors and status.
    fn name(&self) -> &str;
    fn len_bytes(&self) -> u64;
    /// Logical sector size: every offset and length must be a multiple of it.
    fn sector_bytes(&self) -> u32;
    /// Whether seeks are expensive (HDD); mirror read selection and aggregation use it.
    fn is_rotational(&self) -> bool;
    /// Whether several flushes in flight finish sooner than the same flushes one after
    /// another: an SSD's parallel channels do; a disk's one actuator does not, nor does a
    /// file's `fdatasync`, which covers the whole file and waits for the filesystem's journal.
    /// The intent log's `auto` policy keeps fewer groups in flight on a device that cannot
    /// (intent_log/tuner.rs).
    fn parallel_flushes(&self) -> bool {
        !self.is_rotational()
    }
    fn read_at(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> BoxFuture<Result<AlignedBuf, DeviceError>>;
    fn write_at(&self, offset_bytes: u64, data: SharedBuf) -> BoxFuture<Result<(), DeviceError>>;
    /// Makes every completed write durable.
    fn flush(&self) -> BoxFuture<Result<(), DeviceError>>;
    /// Writes and then flushes in one trip to the device, where it has such a path (`None`:
    /// the caller writes, then flushes). An intent-log block is written this way.
    fn write_durable_at(
        &self,
        _offset_bytes: u64,
        _data: SharedBuf,
    ) -> Option<BoxFuture<Result<(), DeviceError>>> {
        None
    }
    /// Makes `[offset, offset+len)` ready for the intent log: on a file, allocated and written
    /// once, so that a durable write there later needs no extent allocation and no filesystem
    /// journal commit, only the data and a cache flush. Called at pool creation for each
    /// vdev's log region (`alloc::log_region_bytes`); the range holds nothing yet. Devices with
    /// nothing to prepare do nothing.
    fn prepare_log_region(
        &self,
        _offset_bytes: u64,
        _len_bytes: u64,
    ) -> BoxFuture<Result<(), DeviceError>> {
        Box::pin(async { Ok(()) })
    }
    /// Tells the device the range is unused; later reads may return zeros or old data.
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> BoxFuture<Result<(), DeviceError>>;
}

/// Checks that `[offset, offset+len)` lies inside a device of `device_bytes` and is aligned to
/// its sectors. Shared by every implementation so they refuse exactly the same requests.
pub(crate) fn check_range(
    device: &str,
    op: DeviceOp,
    offset_bytes: u64,
    len_bytes: u64,
    device_bytes: u64,
    sector_bytes: u32,
) -> Result<(), DeviceError> {
    let sector = u64::from(sector_bytes);
    let end_ok = offset_bytes.checked_add(len_bytes).is_some_and(|end| end <= device_bytes);
    if end_ok && offset_bytes % sector == 0 && len_bytes % sector == 0 {
        Ok(())
    } else {
        Err(DeviceError::OutOfRange {
            device: device.to_owned(),
            op,
            offset_bytes,
            len_bytes,
            device_bytes,
            sector_bytes,
        })
    }
}
