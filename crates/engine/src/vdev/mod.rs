//! The vdev tree: leaves, N-way mirrors and the root that stripes across top-level vdevs
//! (ZFS: `vdev.c`, `vdev_root.c`; docs/design.md, "Layers").
//!
//! Shape: a [`Root`] holds top-level vdevs; each top-level vdev is a single [`Leaf`], a
//! [`Mirror`] of leaves or a [`Raidz`] of leaves. Blocks are addressed by [`VdevAddress`] (top-level vdev, offset): the allocator
//! decides which top-level vdev a block goes to, which is how the pool stripes. Every read takes
//! a verify callback (the checksum from the parent block pointer), so a mirror can tell a good
//! copy from a bad one and heal.

mod leaf;
mod mirror;
pub mod queue;
pub mod raidz;

use std::fmt;
use std::sync::Arc;

pub use leaf::{FaultReason, Leaf, LeafState};
pub use mirror::{Mirror, ReadPolicy, ScrubOutcome, MIRROR_CHILDREN_MAX};
pub use raidz::Raidz;

use crate::device::{AlignedBuf, DeviceError, SharedBuf};
use crate::tunables::IoClass;

/// Largest run of new blocks written to one leaf as one I/O (ZFS's write aggregation limit).
/// The pipeline's runs (crate::zio) and the tree's spans are sized from it.
pub const WRITE_SPAN_BYTES_MAX: u64 = 1 << 20;

/// Identifies a vdev within a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VdevId(pub u32);

impl fmt::Display for VdevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vdev{}", self.0)
    }
}

/// Where one copy of a block is: which top-level vdev, and the byte offset in it. (A block
/// pointer's on-disk `sluice_format::Dva` also carries the allocated size, in sectors.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VdevAddress {
    pub vdev: u32,
    pub offset_bytes: u64,
}

/// One block of a run written at once ([`Root::write_run`]): where it is, what it allocates,
/// and its stored bytes (whole sectors, at most `asize`).
#[derive(Clone, Debug)]
pub struct RunBlock {
    pub offset: u64,
    pub asize: u64,
    pub data: Arc<crate::device::AlignedBuf>,
}

/// What callers match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    Io,
    Checksum,
    Invalid,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VdevError {
    #[error("{vdev}: {cause}")]
    Device { vdev: VdevId, cause: DeviceError },
    #[error("{vdev}: checksum mismatch reading {len_bytes} bytes at offset {offset_bytes}")]
    Checksum { vdev: VdevId, offset_bytes: u64, len_bytes: u32 },
    #[error(
        "{vdev}: no valid copy of {len_bytes} bytes at offset {offset_bytes} ({tried} copies \
         tried); the data is lost unless a scrub finds another copy{}",
        last_said(last)
    )]
    NoValidCopy {
        vdev: VdevId,
        offset_bytes: u64,
        len_bytes: u32,
        tried: u32,
        /// Children that answered with bytes that failed verification.
        mismatched: u32,
        /// Present children whose read failed outright (an I/O error, not a faulted leaf):
        /// their copy may be good, so the block's contents are unknown, not wrong.
        unreadable: u32,
        /// The last child's error (named in the message, not a `source()`).
        last: Option<Box<VdevError>>,
    },
    #[error(
        "{vdev}: {op} of {len_bytes} bytes at offset {offset_bytes} failed on every child{}",
        last_said(last)
    )]
    AllChildrenFailed {
        vdev: VdevId,
        op: &'static str,
        offset_bytes: u64,
        len_bytes: u64,
        /// The last child's error (named in the message, not a `source()`).
        last: Option<Box<VdevError>>,
    },
    #[error(
        "{vdev}: a write of {len_bytes} bytes at offset {offset_bytes} that must reach every \
         child failed on one: {cause}"
    )]
    ChildWriteFailed { vdev: VdevId, offset_bytes: u64, len_bytes: u64, cause: Box<VdevError> },
    #[error(
        "{vdev}: {len_bytes} bytes at offset {offset_bytes} cannot be rebuilt: {}",
        not_rebuilt(*width, *parity, *unreadable, *combinations, *gave_up)
    )]
    NotReconstructed {
        vdev: VdevId,
        offset_bytes: u64,
        len_bytes: u32,
        width: u32,
        parity: u32,
        /// Columns whose read failed on a present leaf: their contents are unknown.
        unreadable: u32,
        /// Combinations of columns taken as wrong that were tried; none verified.
        combinations: u32,
        /// The search stopped at [`raidz::RECONSTRUCT_COMBINATIONS_MAX`] before trying them all.
        gave_up: bool,
    },
    #[error("{vdev}: leaf {device} is offline (bring it back online to use it)")]
    Offline { vdev: VdevId, device: String },
    #[error("no top-level vdev {vdev} in this pool (it has {count})")]
    NoSuchVdev { vdev: u32, count: usize },
    #[error("top-level vdev {vdev} is the hole of a removed log device: nothing is stored there")]
    Hole { vdev: u32 },
}

/// What a RAID-Z read that found no good block tried.
fn not_rebuilt(
    width: u32,
    parity: u32,
    unreadable: u32,
    combinations: u32,
    gave_up: bool,
) -> String {
    if combinations == 0 {
        return format!(
            "more of its {width} columns are missing than its {parity} parity column(s) \
             rebuild; the block can be read again once enough of the missing leaves are back"
        );
    }
    let tried = if gave_up {
        format!(
            "gave up after {combinations} combinations of up to {parity} wrong columns (the limit)"
        )
    } else {
        format!("no combination of up to {parity} of its {width} columns verifies ({combinations} tried)")
    };
    let unknown = if unreadable > 0 {
        format!("; {unreadable} column(s) could not be read and may be good")
    } else {
        String::new()
    };
    format!(
        "{tried}{unknown}; the block is lost unless another copy of it (a ditto copy of \
             metadata) verifies"
    )
}

/// A mirror's last child error, as its own error's message ends: " (the last: ...)".
fn last_said(last: &Option<Box<VdevError>>) -> String {
    last.as_ref().map_or_else(String::new, |error| format!(" (the last: {error})"))
}

impl VdevError {
    /// Whether every copy that could be read was read, and none verified: the block holds
    /// something else. An I/O error on a present copy means its contents are unknown, so
    /// callers that treat "not this block" as an answer (the end of an intent-log chain) must
    /// not take this error as one.
    pub fn is_definite_mismatch(&self) -> bool {
        match self {
            VdevError::Checksum { .. } => true,
            VdevError::NoValidCopy { mismatched, unreadable, .. } => {
                *mismatched > 0 && *unreadable == 0
            }
            // Every combination of columns was tried and none verified, with every column
            // either read or out of service (as a mirror's rule takes a child out of service):
            // the block is not there.
            VdevError::NotReconstructed { unreadable, combinations, gave_up, .. } => {
                *combinations > 0 && *unreadable == 0 && !*gave_up
            }
            _ => false,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            VdevError::Checksum { .. }
            | VdevError::NoValidCopy { .. }
            | VdevError::NotReconstructed { .. } => ErrorKind::Checksum,
            VdevError::NoSuchVdev { .. } | VdevError::Hole { .. } => ErrorKind::Invalid,
            VdevError::Device { .. }
            | VdevError::Offline { .. }
            | VdevError::AllChildrenFailed { .. }
            | VdevError::ChildWriteFailed { .. } => ErrorKind::Io,
        }
    }
}

/// A top-level vdev.
#[derive(Clone, Debug)]
pub enum Vdev {
    Leaf(Arc<Leaf>),
    Mirror(Arc<Mirror>),
    Raidz(Arc<Raidz>),
    /// The place of a removed log device, by its index (ZFS: a hole vdev): no leaves and no
    /// space; reads and writes fail, flushes have nothing to do.
    Hole(u32),
}

impl Vdev {
    /// The device length the vdev's data area is cut from: a leaf's, a mirror's smallest
    /// child's, and for a RAID-Z vdev one child's share (its data end and end labels), not the
    /// vdev's: its data area is fixed in its config (see [`data_area`]).
    ///
    /// [`data_area`]: Vdev::data_area
    pub fn len_bytes(&self) -> u64 {
        match self {
            Vdev::Leaf(leaf) => leaf.device().len_bytes(),
            Vdev::Mirror(mirror) => mirror.len_bytes(),
            Vdev::Raidz(raidz) => raidz.child_end_bytes() + sluice_format::LABEL_BYTES * 2,
            Vdev::Hole(_) => 0,
        }
    }

    /// Where blocks may be allocated: `[start, end)` of the vdev's address space.
    pub fn data_area(&self) -> (u64, u64) {
        match self {
            Vdev::Raidz(raidz) => raidz.data_area(),
            Vdev::Hole(_) => (sluice_format::DATA_START_BYTES, sluice_format::DATA_START_BYTES),
            _ => (sluice_format::DATA_START_BYTES, sluice_format::data_end_bytes(self.len_bytes())),
        }
    }

    /// The bytes a block of `psize` bytes allocates here, sectors of `1 << ashift`.
    pub fn asize(&self, psize: u64, ashift: u32) -> u64 {
        match self {
            Vdev::Raidz(raidz) => raidz.asize(psize),
            _ => psize.next_multiple_of(1 << ashift),
        }
    }

    /// Every leaf under this vdev.
    pub fn leaves(&self) -> Vec<Arc<Leaf>> {
        match self {
            Vdev::Leaf(leaf) => vec![Arc::clone(leaf)],
            Vdev::Mirror(mirror) => mirror.children().to_vec(),
            Vdev::Raidz(raidz) => raidz.leaves(),
            Vdev::Hole(_) => Vec::new(),
        }
    }

    pub async fn read(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        self.read_counting(offset, len, class, verify, true).await
    }

    /// As `read`; with `count_if_none` false, a block that no copy verifies is not counted
    /// as a checksum error (the end of an intent-log chain is such a block, by design).
    pub async fn read_counting(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        count_if_none: bool,
    ) -> Result<AlignedBuf, VdevError> {
        match self {
            Vdev::Leaf(leaf) => {
                let buf = leaf.read(offset, len, class).await?;
                if verify(&buf) {
                    Ok(buf)
                } else {
                    if count_if_none {
                        leaf.count_checksum_error();
                    }
                    Err(VdevError::Checksum {
                        vdev: leaf.id(),
                        offset_bytes: offset,
                        len_bytes: len,
                    })
                }
            }
            Vdev::Mirror(mirror) => {
                mirror.read_counting(offset, len, class, verify, count_if_none).await
            }
            Vdev::Raidz(raidz) => {
                raidz.read_counting(offset, len, class, verify, count_if_none).await
            }
            Vdev::Hole(vdev) => Err(VdevError::Hole { vdev: *vdev }),
        }
    }

    /// Writes, and when `durable` flushes what was written before answering.
    pub async fn write(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        match self {
            Vdev::Leaf(leaf) => leaf.write_flushed(offset, data, class, durable).await,
            Vdev::Mirror(mirror) => mirror.write_flushed(offset, data, class, durable).await,
            Vdev::Raidz(raidz) => raidz.write_flushed(offset, data, class, durable).await,
            Vdev::Hole(vdev) => Err(VdevError::Hole { vdev: *vdev }),
        }
    }

    /// Checks every copy of a block on this vdev and repairs what it can.
    pub async fn scrub(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> ScrubOutcome {
        match self {
            Vdev::Leaf(leaf) => {
                let good =
                    matches!(leaf.read(offset, len, IoClass::Scrub).await, Ok(buf) if verify(&buf));
                if !good {
                    leaf.count_checksum_error();
                }
                ScrubOutcome { errors: u32::from(!good), repaired: 0, unrecoverable: !good }
            }
            Vdev::Mirror(mirror) => mirror.scrub(offset, len, verify).await,
            Vdev::Raidz(raidz) => raidz.scrub(offset, len, verify).await,
            // Nothing is there to check (no block points here).
            Vdev::Hole(_) => ScrubOutcome::default(),
        }
    }

    /// Copies a block onto the `targets` leaves (ones that missed writes) from a copy on
    /// another child that verifies. A lone leaf has nowhere to copy from: nothing is done.
    pub async fn resilver(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        targets: &[VdevId],
    ) -> ScrubOutcome {
        match self {
            Vdev::Leaf(_) | Vdev::Hole(_) => ScrubOutcome::default(),
            Vdev::Mirror(mirror) => mirror.resilver(offset, len, verify, targets).await,
            Vdev::Raidz(raidz) => raidz.resilver(offset, len, verify, targets).await,
        }
    }

    pub async fn flush(&self) -> Result<(), VdevError> {
        match self {
            Vdev::Leaf(leaf) => leaf.flush().await,
            Vdev::Mirror(mirror) => mirror.flush().await,
            Vdev::Raidz(raidz) => raidz.flush().await,
            Vdev::Hole(_) => Ok(()),
        }
    }

    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        match self {
            Vdev::Leaf(leaf) => leaf.discard(offset, len).await,
            Vdev::Mirror(mirror) => mirror.discard(offset, len).await,
            Vdev::Raidz(raidz) => raidz.discard(offset, len).await,
            Vdev::Hole(vdev) => Err(VdevError::Hole { vdev: *vdev }),
        }
    }
}

/// The root of the tree: the pool's top-level vdevs.
#[derive(Clone, Debug)]
pub struct Root {
    top: Vec<Vdev>,
}

impl Root {
    pub fn new(top: Vec<Vdev>) -> Root {
        assert!(!top.is_empty(), "a pool needs at least one top-level vdev");
        Root { top }
    }

    pub fn top_level(&self) -> &[Vdev] {
        &self.top
    }

    /// Top-level vdev `vdev` if it is a single leaf: there a write or a flush that returns
    /// Ok took effect on the only copy, so writes issued unflushed and one flush after them are
    /// as durable as durable writes. On a mirror an unflushed write and a flush each succeed
    /// when one child did (`Mirror::write`, `Mirror::flush`), and on RAID-Z a write succeeds
    /// with up to its parity's columns missing; there only [`Root::write_durable`] puts an
    /// acknowledged write on every present copy, so the intent log keeps it for them.
    pub fn plain_leaf(&self, vdev: u32) -> Option<Arc<Leaf>> {
        match self.top.get(vdev as usize) {
            Some(Vdev::Leaf(leaf)) => Some(Arc::clone(leaf)),
            _ => None,
        }
    }

    pub fn leaves(&self) -> Vec<Arc<Leaf>> {
        self.top.iter().flat_map(Vdev::leaves).collect()
    }

    /// Turns the rewriting of bad mirror copies on or off (off while opened read-only).
    pub fn set_repairs(&self, on: bool) {
        for vdev in &self.top {
            match vdev {
                Vdev::Mirror(mirror) => mirror.set_repairs(on),
                Vdev::Raidz(raidz) => raidz.set_repairs(on),
                Vdev::Leaf(_) | Vdev::Hole(_) => {}
            }
        }
    }

    fn vdev(&self, dva: VdevAddress) -> Result<&Vdev, VdevError> {
        match self.top.get(dva.vdev as usize) {
            None => Err(VdevError::NoSuchVdev { vdev: dva.vdev, count: self.top.len() }),
            Some(Vdev::Hole(vdev)) => Err(VdevError::Hole { vdev: *vdev }),
            Some(vdev) => Ok(vdev),
        }
    }

    /// Maps a logical offset striped in `stripe_bytes` units round-robin over the top-level
    /// vdevs to its address (the layout the allocator produces for sequentially written data).
    pub fn stripe(&self, logical_offset: u64, stripe_bytes: u64) -> VdevAddress {
        let count = self.top.len() as u64;
        let unit = logical_offset / stripe_bytes;
        VdevAddress {
            vdev: (unit % count) as u32,
            offset_bytes: (unit / count) * stripe_bytes + logical_offset % stripe_bytes,
        }
    }

    pub async fn read(
        &self,
        dva: VdevAddress,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        self.vdev(dva)?.read(dva.offset_bytes, len, class, verify).await
    }

    /// Reads an intent-log block: it may legitimately verify on no copy (the end of a chain:
    /// see `Vdev::read_counting`), and a RAID-Z vdev lays it out as it does log blocks.
    pub async fn read_log(
        &self,
        dva: VdevAddress,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        match self.vdev(dva)? {
            Vdev::Raidz(raidz) => raidz.read_log(dva.offset_bytes, len, class, verify).await,
            vdev => vdev.read_counting(dva.offset_bytes, len, class, verify, false).await,
        }
    }

    /// Writes an intent-log block, durably as [`Root::write_durable`] when `durable`; a
    /// RAID-Z vdev lays it out as it does log blocks.
    pub async fn write_log(
        &self,
        dva: VdevAddress,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        match self.vdev(dva)? {
            Vdev::Raidz(raidz) => raidz.write_log(dva.offset_bytes, data, class, durable).await,
            _ if durable => self.write_durable(dva, data, class).await,
            _ => self.write(dva, data, class).await,
        }
    }

    pub async fn write(
        &self,
        dva: VdevAddress,
        data: SharedBuf,
        class: IoClass,
    ) -> Result<(), VdevError> {
        self.vdev(dva)?.write(dva.offset_bytes, data, class, false).await
    }

    /// Writes and flushes the copy at `dva` on every mirror child before answering, and fails
    /// if any child that is not faulted failed. The intent log writes this way (on a single
    /// leaf, blocks for indirect records and the lwbs beside them are written unflushed and
    /// flushed once after: [`Root::plain_leaf`]): an import
    /// ends a chain at a block that no readable copy holds, so an acknowledged record must be
    /// on every copy an import may find alone (a write that reached only one child, read
    /// back from the other after the first went missing, would end the chain silently). A
    /// failed log write makes the commit fall back to a txg sync.
    pub async fn write_durable(
        &self,
        dva: VdevAddress,
        data: SharedBuf,
        class: IoClass,
    ) -> Result<(), VdevError> {
        match self.vdev(dva)? {
            Vdev::Leaf(leaf) => leaf.write_flushed(dva.offset_bytes, data, class, true).await,
            Vdev::Mirror(mirror) => {
                mirror.write_flushed_everywhere(dva.offset_bytes, data, class).await
            }
            Vdev::Raidz(raidz) => raidz.write_flushed(dva.offset_bytes, data, class, true).await,
            Vdev::Hole(vdev) => Err(VdevError::Hole { vdev: *vdev }),
        }
    }

    /// The most bytes of blocks one run writes ([`crate::zio::span_runs`]): a write of up to
    /// [`WRITE_SPAN_BYTES_MAX`] to each leaf. A RAID-Z vdev spreads a run over its
    /// data columns, so its runs are that many times longer: with runs of 1 MiB, a raidz1 of 4
    /// wrote 256 KiB per child, and its 1 MiB writes ran at 0.89x a mirror's that wrote 1 MiB
    /// per child (docs/bench/raidz.md).
    pub fn write_span_bytes(&self) -> u64 {
        let widest = self
            .top
            .iter()
            .map(|vdev| match vdev {
                Vdev::Raidz(raidz) => {
                    u64::from(raidz.geometry().width() - raidz.geometry().parity())
                }
                _ => 1,
            })
            .max()
            .unwrap_or(1);
        WRITE_SPAN_BYTES_MAX * widest
    }

    /// Writes `blocks`, back to back on top-level vdev `vdev` from the first one's offset, as
    /// one write per leaf: a leaf's or a mirror's as one vectored write of the blocks' own
    /// buffers, each padded with zeros to its allocation where another follows; a RAID-Z
    /// vdev's as one write per child of the blocks' columns ([`Raidz::write_run`]). With
    /// `durable`, as [`Root::write_durable`].
    pub async fn write_run(
        &self,
        vdev: u32,
        blocks: Vec<RunBlock>,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let dva = VdevAddress { vdev, offset_bytes: blocks.first().map_or(0, |b| b.offset) };
        if let Vdev::Raidz(raidz) = self.vdev(dva)? {
            return raidz.write_run(&blocks, class, durable).await;
        }
        let mut next = dva.offset_bytes;
        let last = blocks.len().saturating_sub(1);
        let pieces: Vec<Arc<AlignedBuf>> = blocks
            .into_iter()
            .enumerate()
            .map(|(i, block)| {
                assert_eq!(block.offset, next, "a run's blocks lie back to back");
                next = block.offset + block.asize;
                if block.data.len() as u64 == block.asize || i == last {
                    block.data
                } else {
                    Arc::new(AlignedBuf::gathered(block.asize as usize, [(0, &block.data[..])]))
                }
            })
            .collect();
        let data = SharedBuf::gather(pieces);
        if durable {
            self.write_durable(dva, data, class).await
        } else {
            self.write(dva, data, class).await
        }
    }

    /// Flushes every top-level vdev; fails if any top-level vdev could not flush at all.
    pub async fn flush(&self) -> Result<(), VdevError> {
        let results = futures::future::join_all(self.top.iter().map(Vdev::flush)).await;
        results.into_iter().collect()
    }
}
