//! Fault injection on a real device (ZFS: `zinject`): a wrapper that passes every operation
//! through until told to fail reads, writes, or everything (as if the device had been pulled).
//! `sluice pool inject` sets it on a served pool's leaf, so the failure handling that the
//! simulator tests (diagnosis, degraded service, replace) can be shown against real files and
//! real clients. Unarmed, it costs one relaxed atomic load per operation.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::{AlignedBuf, BlockDevice, DeviceError, DeviceOp, SharedBuf};
use crate::rt::BoxFuture;

/// What an [`Injected`] device fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injection {
    /// Nothing: every operation reaches the device.
    None = 0,
    /// Reads fail with EIO.
    ReadErrors = 1,
    /// Writes and flushes fail with EIO.
    WriteErrors = 2,
    /// Everything fails as if the device were gone.
    Gone = 3,
}

impl Injection {
    /// Parses the names `pool inject` takes.
    pub fn parse(text: &str) -> Option<Injection> {
        match text {
            "clear" | "none" => Some(Injection::None),
            "read-errors" => Some(Injection::ReadErrors),
            "write-errors" => Some(Injection::WriteErrors),
            "gone" => Some(Injection::Gone),
            _ => None,
        }
    }

    fn decode(raw: u8) -> Injection {
        match raw {
            1 => Injection::ReadErrors,
            2 => Injection::WriteErrors,
            3 => Injection::Gone,
            _ => Injection::None,
        }
    }
}

/// Sets what an [`Injected`] device fails; shared with the device.
#[derive(Clone, Debug, Default)]
pub struct InjectHandle(Arc<AtomicU8>);

impl InjectHandle {
    pub fn set(&self, injection: Injection) {
        self.0.store(injection as u8, Ordering::Relaxed);
    }

    pub fn get(&self) -> Injection {
        Injection::decode(self.0.load(Ordering::Relaxed))
    }
}

/// A device whose operations can be made to fail (see the module doc).
pub struct Injected {
    inner: Arc<dyn BlockDevice>,
    handle: InjectHandle,
}

impl std::fmt::Debug for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injected")
            .field("device", &self.inner.name())
            .field("injection", &self.handle.get())
            .finish()
    }
}

impl Injected {
    pub fn new(inner: Arc<dyn BlockDevice>) -> (Injected, InjectHandle) {
        let handle = InjectHandle::default();
        (Injected { inner, handle: handle.clone() }, handle)
    }

    /// The error for `op` under the current injection, if it fails.
    fn failure(&self, op: DeviceOp, offset_bytes: u64, len_bytes: u64) -> Option<DeviceError> {
        let injection = self.handle.get();
        let fails = match injection {
            Injection::None => false,
            Injection::ReadErrors => op == DeviceOp::Read,
            Injection::WriteErrors => matches!(op, DeviceOp::Write | DeviceOp::Flush),
            Injection::Gone => true,
        };
        if !fails {
            return None;
        }
        let device = self.inner.name().to_owned();
        Some(if injection == Injection::Gone {
            DeviceError::Gone { device }
        } else {
            DeviceError::Io {
                device,
                op,
                offset_bytes,
                len_bytes,
                cause: std::io::Error::other("injected I/O error"),
            }
        })
    }
}

impl BlockDevice for Injected {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    fn sector_bytes(&self) -> u32 {
        self.inner.sector_bytes()
    }

    fn is_rotational(&self) -> bool {
        self.inner.is_rotational()
    }

    fn parallel_flushes(&self) -> bool {
        self.inner.parallel_flushes()
    }

    fn read_at(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> BoxFuture<Result<AlignedBuf, DeviceError>> {
        match self.failure(DeviceOp::Read, offset_bytes, u64::from(len_bytes)) {
            Some(error) => Box::pin(async move { Err(error) }),
            None => self.inner.read_at(offset_bytes, len_bytes),
        }
    }

    fn write_at(&self, offset_bytes: u64, data: SharedBuf) -> BoxFuture<Result<(), DeviceError>> {
        match self.failure(DeviceOp::Write, offset_bytes, data.len() as u64) {
            Some(error) => Box::pin(async move { Err(error) }),
            None => self.inner.write_at(offset_bytes, data),
        }
    }

    fn flush(&self) -> BoxFuture<Result<(), DeviceError>> {
        match self.failure(DeviceOp::Flush, 0, 0) {
            Some(error) => Box::pin(async move { Err(error) }),
            None => self.inner.flush(),
        }
    }

    fn write_durable_at(
        &self,
        offset_bytes: u64,
        data: SharedBuf,
    ) -> Option<BoxFuture<Result<(), DeviceError>>> {
        match self.failure(DeviceOp::Write, offset_bytes, data.len() as u64) {
            Some(error) => Some(Box::pin(async move { Err(error) })),
            None => self.inner.write_durable_at(offset_bytes, data),
        }
    }

    fn prepare_log_region(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> BoxFuture<Result<(), DeviceError>> {
        match self.failure(DeviceOp::Write, offset_bytes, len_bytes) {
            Some(error) => Box::pin(async move { Err(error) }),
            None => self.inner.prepare_log_region(offset_bytes, len_bytes),
        }
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> BoxFuture<Result<(), DeviceError>> {
        match self.failure(DeviceOp::Discard, offset_bytes, len_bytes) {
            Some(error) => Box::pin(async move { Err(error) }),
            None => self.inner.discard(offset_bytes, len_bytes),
        }
    }
}
