//! A stand-in for a leaf that is not there: every operation fails at once with
//! `DeviceError::Gone`, so a degraded mirror keeps its shape and the missing child is simply
//! never readable.

use futures::FutureExt;

use crate::device::{AlignedBuf, BlockDevice, DeviceError, SharedBuf};
use crate::rt::BoxFuture;

#[derive(Debug)]
pub struct MissingDevice {
    pub name: String,
    pub len_bytes: u64,
}

impl MissingDevice {
    fn gone<T: Send + 'static>(&self) -> BoxFuture<Result<T, DeviceError>> {
        let device = self.name.clone();
        async move { Err(DeviceError::Gone { device }) }.boxed()
    }
}

impl BlockDevice for MissingDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn sector_bytes(&self) -> u32 {
        512
    }

    fn is_rotational(&self) -> bool {
        false
    }

    fn read_at(&self, _: u64, _: u32) -> BoxFuture<Result<AlignedBuf, DeviceError>> {
        self.gone()
    }

    fn write_at(&self, _: u64, _: SharedBuf) -> BoxFuture<Result<(), DeviceError>> {
        self.gone()
    }

    fn flush(&self) -> BoxFuture<Result<(), DeviceError>> {
        self.gone()
    }

    fn discard(&self, _: u64, _: u64) -> BoxFuture<Result<(), DeviceError>> {
        self.gone()
    }
}
