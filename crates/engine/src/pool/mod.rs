//! Pools: identity, layout and the uberblock ring (ZFS: `spa.c`, `vdev_label.c`).
//!
//! A pool is a named set of top-level vdevs, each a leaf or a mirror. Every leaf carries four
//! labels (crates/format `label`): who it is, which pool and top-level vdev it belongs to, the
//! whole vdev tree, and a ring of uberblocks.
//!
//! - `create` checks the layout (name, mirror widths, leaf sizes), draws guids from the `Env`,
//!   writes every label and a first uberblock, and flushes.
//! - `import` reads the labels of the devices it is given, groups them by pool, rebuilds the
//!   vdev tree from the newest configuration, and picks the newest uberblock that verifies on
//!   any leaf. A mirror with missing children opens degraded (the missing ones are stand-ins
//!   that fail every I/O); a top-level vdev with no child present is beyond redundancy, and
//!   import refuses, naming the missing leaves.
//! - `sync_uberblock` makes a new txg's root durable: flush every leaf (the tree below the root
//!   must be durable first), check that every vdev can serve each block the txg wrote from
//!   leaves holding a flushed copy (a mirror's write and flush each succeed on one child's
//!   word), write the uberblock into every label's ring, flush again, and check that a leaf of
//!   every vdev holds it flushed. A crash in between leaves the previous uberblock in its own
//!   slot, so import finds one or the other, never a mix.
//!
//! The vdev tree (configuration, I/O tree and leaves) is one `Arc<VdevTree>` behind a lock held
//! only to clone or replace the Arc: a change of leaves builds a new tree around the same
//! `Arc<Leaf>`s and swaps it in, and I/O already under way finishes on the tree it started
//! with. What the pool remembers per leaf is kept by leaf guid, not by position.
//!
//! Lock order: the administration lock (`admin.rs`) -> the pool state mutex and the tree
//! lock, none held across an `.await`, and the last two never while taking the other.

mod add;
mod admin;
mod attach;
mod cache;
mod io;
mod missing;
pub mod probe;
mod props;
mod remove;
mod scrub;
mod spare;
mod zfeature;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::join_all;
use parking_lot::{Mutex, RwLock};
use sluice_format::raidz::{RaidzGeometry, RaidzLayout};
use sluice_format::{
    label_offsets, uberblock_offset, BlockPointer, FormatError, LabelHeader, LeafConfig,
    RaidzConfig, TopConfig, TopKind, Uberblock, VdevTreeConfig, DATA_START_BYTES, LABEL_BYTES,
    LABEL_HEADER_BYTES, LABEL_VERSION, POOL_NAME_BYTES_MAX, UBERBLOCK_BYTES, UBERBLOCK_SLOTS,
};

pub use self::add::PreparedAdd;
pub use self::attach::PreparedAttach;
#[cfg(test)]
pub(crate) use self::cache::test_bp;
pub use self::cache::BlockCache;
pub use self::io::{follows, single_copy};
pub use self::missing::MissingDevice;
pub use self::scrub::{ScrubReport, VerifyReport};
pub use self::spare::{PreparedActivation, PreparedSpares, SpareLeaf, SpareStatus};
use crate::alloc::{log_region_bytes, vdev_log_region_bytes};
use crate::device::{BlockDevice, DeviceError, SharedBuf};
use crate::rt::Env;
use crate::tunables::{IoClass, Tunables};
use crate::vdev::{Leaf, Mirror, Raidz, Root, Vdev, VdevError, VdevId, MIRROR_CHILDREN_MAX};

/// Every leaf a top-level vdev's config names: its children, then the leaves replacing some
/// of a RAID-Z vdev's children (the order `build_vdev` takes them in).
pub(crate) fn config_leaves(top: &TopConfig) -> impl Iterator<Item = &LeafConfig> {
    top.children.iter().chain(top.raidz.iter().flat_map(|r| r.replacing.iter().map(|(_, l)| l)))
}

/// Builds top-level vdev `index` as `top` describes it, from its leaves in [`config_leaves`]
/// order; `None` when they do not fit the config.
pub(crate) fn build_vdev(
    index: usize,
    top: &TopConfig,
    leaves: Vec<Arc<Leaf>>,
    ashift: u8,
    env: &Env,
    tunables: &Tunables,
) -> Option<Vdev> {
    let id = VdevId(1000 + index as u32);
    match top.kind {
        TopKind::Leaf => leaves.into_iter().next().map(Vdev::Leaf),
        TopKind::Hole => leaves.is_empty().then_some(Vdev::Hole(index as u32)),
        TopKind::Mirror => (!leaves.is_empty())
            .then(|| Vdev::Mirror(Arc::new(Mirror::new(id, env, leaves, tunables)))),
        TopKind::Raidz => {
            let raidz = top.raidz.as_ref()?;
            let width = top.children.len();
            let log_layout =
                if raidz.log_copies { RaidzLayout::Copies } else { RaidzLayout::Striped };
            let geometry =
                RaidzGeometry::new(width as u32, u32::from(raidz.parity), u32::from(ashift))
                    .ok()?
                    .with_log_layout(log_layout);
            if leaves.len() != width + raidz.replacing.len() {
                return None;
            }
            let mut leaves = leaves.into_iter();
            let children: Vec<Arc<Leaf>> = leaves.by_ref().take(width).collect();
            let mut replacing = vec![None; width];
            for ((column, _), leaf) in raidz.replacing.iter().zip(leaves) {
                *replacing.get_mut(usize::from(*column))? = Some(leaf);
            }
            if raidz.child_end_bytes <= DATA_START_BYTES {
                return None;
            }
            Some(Vdev::Raidz(Arc::new(Raidz::new(
                id,
                geometry,
                children,
                replacing,
                raidz.child_end_bytes,
            ))))
        }
    }
}

/// A leaf a pool is built with: its top-level vdev's index, its config, its device, and
/// whether it was found (a stand-in fills a missing one's place).
type Member = (usize, LeafConfig, Arc<dyn BlockDevice>, bool);

/// Where each leaf of `vdev` keeps its log region (start, bytes): what a new leaf prepares.
pub(crate) fn log_region_of(vdev: &Vdev, ashift: u8) -> (u64, u64) {
    let (start, end) = vdev.data_area();
    match vdev {
        Vdev::Raidz(raidz) => {
            let region = vdev_log_region_bytes(end - start, Some(&raidz.geometry()));
            let width = u64::from(raidz.geometry().width());
            let sector = 1u64 << ashift;
            (DATA_START_BYTES, region.div_ceil(width).next_multiple_of(sector))
        }
        _ => (start, log_region_bytes(end - start)),
    }
}

/// Smallest leaf: labels, the reserved start and room for data.
pub const LEAF_BYTES_MIN: u64 = 16 << 20;

/// A device offered to a pool, with the path or name it is known by.
#[derive(Clone)]
pub struct LeafSpec {
    pub path: String,
    pub device: Arc<dyn BlockDevice>,
}

impl std::fmt::Debug for LeafSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafSpec").field("path", &self.path).finish()
    }
}

/// One top-level vdev of a pool to create.
#[derive(Clone, Debug)]
pub enum TopSpec {
    Leaf(LeafSpec),
    Mirror(Vec<LeafSpec>),
    /// A RAID-Z vdev of the leaves, in column order, with `parity` (1 to 3) of every block's
    /// columns parity.
    Raidz {
        parity: u8,
        leaves: Vec<LeafSpec>,
    },
    /// A separate intent-log device (SLOG): a leaf or a mirror that holds only log blocks.
    Log(Box<TopSpec>),
    /// Hot spares (not a vdev: leaves that stand in for one that faults or degrades).
    Spare(Vec<LeafSpec>),
}

/// What `create` builds.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub name: String,
    /// log2 of the smallest allocation; raised to the leaves' sector size if smaller.
    pub ashift: u8,
    pub top: Vec<TopSpec>,
}

/// The optional format features a new pool is made with (ZFS: `zpool create` enables every
/// feature the build supports, `-d` none). Those a layout needs (`raidz`, `spares`) are listed
/// whatever this says; these change only how blocks are laid out, so a pool made without them
/// is one that older builds still read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewFeatures {
    /// RAID-Z vdevs write intent-log blocks as copies (feature `raidz_log_copies`); without
    /// it, striped, as before the feature. Fixed for each vdev's life: a RAID-Z vdev added
    /// later takes copies.
    pub raidz_log_copies: bool,
    /// Indirect blocks are stored lz4-compressed (feature `lz4_indirect`); `pool upgrade`
    /// enables it later.
    pub lz4_indirect: bool,
}

impl NewFeatures {
    /// Every optional feature: a new pool's default.
    pub const ALL: NewFeatures = NewFeatures { raidz_log_copies: true, lz4_indirect: true };
    /// None (`pool create -d`).
    pub const NONE: NewFeatures = NewFeatures { raidz_log_copies: false, lz4_indirect: false };
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("pool name {name:?} is invalid: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("pool {pool}: invalid layout: {reason}")]
    InvalidLayout { pool: String, reason: String },
    #[error("pool {pool}: leaf {path} has {len_bytes} bytes; leaves need at least {min_bytes}")]
    LeafTooSmall { pool: String, path: String, len_bytes: u64, min_bytes: u64 },
    #[error("no pool named {name} on the {searched} devices searched; check the paths (and -d)")]
    NotFound { name: String, searched: usize },
    #[error(
        "no pool named {name} that this build can read on the {searched} devices searched, but \
         {leaves} hold sluice labels of label format version {version}, newer than this build \
         reads (up to {readable}): the pool may be there; import it with the newer sluice \
         that wrote them"
    )]
    NewerLabels { name: String, searched: usize, leaves: String, version: u16, readable: u16 },
    #[error("several pools are named {name} (guids {guids:?}); import by guid instead")]
    Ambiguous { name: String, guids: Vec<u64> },
    #[error(
        "pool {pool}: top-level vdev {top} has no usable leaf (missing: {missing}); the pool \
         cannot be opened until at least one of them is attached again"
    )]
    MissingLeaves { pool: String, top: usize, missing: String },
    #[error(
        "pool {pool}: RAID-Z vdev {top} (raidz{parity}) has {columns} of its leaves missing \
         ({missing}) and rebuilds at most {parity}; the pool cannot be opened until {need} of \
         them {is_are} found again (import with -d naming their directory)",
        is_are = if *need == 1 { "is" } else { "are" }
    )]
    RaidzColumnsMissing {
        pool: String,
        top: usize,
        parity: u8,
        columns: usize,
        need: usize,
        missing: String,
    },
    #[error(
        "pool {pool}: the rewind could not erase the abandoned txgs' uberblocks on any leaf of \
         top-level vdev {top}, so a later import could return to them; nothing else was \
         written. Check that vdev's devices and import with the rewind again"
    )]
    RewindNotRecorded { pool: String, top: usize },
    #[error("pool {pool} has no leaf {leaf}; its leaves are: {leaves}")]
    NoSuchLeaf { pool: String, leaf: String, leaves: String },
    #[error("pool {pool} has no hot spare {spare}; its spares are: {spares}")]
    NoSuchSpare { pool: String, spare: String, spares: String },
    #[error(
        "pool {pool}: hot spare {spare} is in use, standing in for {leaf}; replace {leaf} (the \
         spare goes back once the new leaf holds everything) or detach the spare first"
    )]
    SpareInUse { pool: String, spare: String, leaf: String },
    #[error("pool {pool}: cannot remove {device}: {reason}")]
    CannotRemove { pool: String, device: String, reason: String },
    #[error(
        "pool {pool}: cannot {action} {leaf}: no valid replicas (no other leaf of its vdev is \
         in service with every txg, so nothing could be copied from or served instead); \
         bring such a leaf online or let its resilver finish first; if none is left, the \
         data on this vdev can only come back from a backup"
    )]
    NoValidReplicas { pool: String, leaf: String, action: &'static str },
    #[error(
        "pool {pool}: leaf {leaf} was not found when the pool was imported; export the pool and \
         import it again with the device present (-d), or replace the leaf"
    )]
    LeafMissing { pool: String, leaf: String },
    #[error("pool {pool}: {path} is already one of its leaves")]
    AlreadyMember { pool: String, path: String },
    #[error(
        "pool {pool}: cannot attach to {leaf}: its mirror already has {max} leaves, the most a \
         mirror may have; detach one first"
    )]
    MirrorFull { pool: String, leaf: String, max: usize },
    #[error(
        "pool {pool}: {path} has {sector}-byte sectors, larger than the pool's allocation unit \
         (2^{ashift} bytes); use a device with sectors of at most that size"
    )]
    SectorTooLarge { pool: String, path: String, sector: u32, ashift: u8 },
    #[error(
        "pool {pool}: cannot detach {leaf}: it is its vdev's only leaf (only a leaf of a mirror \
         can be detached); replace it with another device instead"
    )]
    NotMirror { pool: String, leaf: String },
    #[error(
        "pool {pool}: {leaf} is a child of a RAID-Z vdev, which cannot take another leaf (that \
         would be RAID-Z expansion, which sluice does not do); to swap the disk, use pool \
         replace"
    )]
    RaidzAttach { pool: String, leaf: String },
    #[error(
        "pool {pool}: the change of leaves took effect (the pool directory records it), but \
         no leaf's labels could be rewritten (the first tried: {path}); the next import \
         rewrites them. Check the devices"
    )]
    LabelsNotWritten { pool: String, path: String },
    #[error(
        "pool {pool}: {block} passed its checksum but does not decompress ({cause}); this is \
         a bug in whatever wrote it, please report it"
    )]
    Decompress { pool: String, block: String, cause: crate::zio::compress::DecompressError },
    /// A block of an encrypted volume was read while its key family's key is not loaded.
    #[error(
        "pool {pool}: {block} is encrypted with key family {family:#018x}, whose key is not \
         loaded; load it with `sluice key load`"
    )]
    KeyUnavailable { pool: String, block: String, family: u64 },
    /// A block passed its checksum but not its MAC: its bytes or the pointer fields its MAC
    /// covers were changed on the disk by someone who could recompute the checksum. Its data
    /// is not returned.
    #[error(
        "pool {pool}: {block} fails authentication: it was changed on the disk; its data is not \
         returned"
    )]
    Authentication { pool: String, block: String },
    #[error("pool {pool}: {block}: {cause}")]
    Crypt { pool: String, block: String, cause: crate::zio::crypt::CryptError },
    #[error(
        "pool {pool}: an error injected at the {stage} stage of a {writer} block (an armed fault)"
    )]
    Injected { pool: String, stage: crate::zio::Stage, writer: crate::zio::Writer },
    /// A block a raw receive wrote in place failed its write: its bytes are another pool's
    /// ciphertext, which no sync can write again (the receive fails and is undone).
    #[error(
        "pool {pool}: block {block} of {volume}, written in place by a raw receive, failed its \
         write; receive the stream again"
    )]
    RawBlockUnwritten { pool: String, volume: String, block: u64 },
    /// A sync's flushes answered, but on top-level vdev `top` the leaves that took every
    /// write of `what` and flushed it cannot serve it: a mirror's write and its flush each
    /// succeed when one child did, so a block one leaf failed to write and a flush only that
    /// leaf completed would otherwise have counted as durable.
    #[error(
        "pool {pool}: txg {txg} is not durable on {vdev}: {needs} {what} ({leaves}). The txg is \
         not committed and nothing more is written; check those devices (pool status), then \
         import the pool again: it opens at the last committed txg with the intent log \
         replayed, so nothing acknowledged is lost",
        needs = match columns {
            Some((need, width)) => format!("fewer than {need} of its {width} columns hold"),
            None => "no leaf holds".to_owned(),
        }
    )]
    NotDurable {
        pool: String,
        txg: u64,
        vdev: String,
        /// On RAID-Z: how many of its columns must hold it, of how many.
        columns: Option<(u16, u16)>,
        what: &'static str,
        leaves: String,
    },
    #[error("pool {pool}: no valid uberblock on any leaf; the labels are damaged")]
    NoUberblock { pool: String },
    #[error("pool {pool}: leaf {path}: {cause}")]
    Device { pool: String, path: String, cause: DeviceError },
    #[error("pool {pool}: {cause}")]
    Vdev { pool: String, cause: VdevError },
    #[error("pool {pool}: {cause}")]
    NoSpace { pool: String, cause: crate::alloc::AllocError },
    #[error("pool {pool}: {cause}")]
    Format { pool: String, cause: FormatError },
}

impl PoolError {
    /// What a caller does about it: the NBD server turns this into the errno a client sees.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind;
        match self {
            PoolError::NoSpace { cause: crate::alloc::AllocError::NoSpace { .. }, .. } => {
                ErrorKind::NoSpace
            }
            PoolError::InvalidName { .. }
            | PoolError::InvalidLayout { .. }
            | PoolError::LeafTooSmall { .. } => ErrorKind::Invalid,
            PoolError::NotFound { .. }
            | PoolError::NewerLabels { .. }
            | PoolError::Ambiguous { .. }
            | PoolError::NoSuchLeaf { .. }
            | PoolError::NoSuchSpare { .. } => ErrorKind::NotFound,
            PoolError::NoValidReplicas { .. }
            | PoolError::LeafMissing { .. }
            | PoolError::AlreadyMember { .. }
            | PoolError::MirrorFull { .. }
            | PoolError::SectorTooLarge { .. }
            | PoolError::NotMirror { .. }
            | PoolError::SpareInUse { .. }
            | PoolError::CannotRemove { .. }
            | PoolError::RaidzAttach { .. } => ErrorKind::Invalid,
            PoolError::Vdev { cause: source, .. } => match source.kind() {
                crate::vdev::ErrorKind::Checksum => ErrorKind::Checksum,
                _ => ErrorKind::Io,
            },
            _ => ErrorKind::Io,
        }
    }
}

/// One leaf of an open pool.
#[derive(Clone, Debug)]
pub struct PoolLeaf {
    pub guid: u64,
    pub top: usize,
    pub path: String,
    pub leaf: Arc<Leaf>,
    /// False for a leaf missing at import (a stand-in fills its place).
    pub present: bool,
}

#[derive(Debug)]
struct PoolState {
    uberblock: Uberblock,
    /// Every valid uberblock import found, one per txg, newest first: what a rewind can go
    /// back to.
    found: Vec<Uberblock>,
    /// By leaf guid: the newest txg the leaf is known to hold completely, from its own
    /// uberblock rings at import, then advanced by each sync that found it complete up to the
    /// txg before and saw it miss no write. A leaf behind the pool's txg needs a resilver of
    /// the blocks born after it.
    leaf_txg: BTreeMap<u64, u64>,
    /// By leaf guid: [`Leaf::writes_missed`] at the end of the last sync.
    leaf_missed: BTreeMap<u64, u64>,
    /// For the last few txgs: each leaf's counts (by guid) when the txg became the open one.
    missed_when_opened: BTreeMap<u64, BTreeMap<u64, OpenedCounts>>,
    /// By leaf guid: [`Leaf::copies_missed`] at the end of the last sync that committed: for
    /// a pool synced without a store noting its txgs, and for a detach, which leaves only
    /// leaves that missed no copy since ([`Pool::has_complete_copy`]).
    leaf_copies: BTreeMap<u64, u64>,
    /// Leaves (by guid) taken offline to stay offline across imports (`pool offline` without
    /// `-t`): the pool directory records them.
    offline_kept: std::collections::BTreeSet<u64>,
    /// Leaves being replaced (`pool replace`): old leaf's guid -> the guid of the leaf
    /// replacing it. The old leaf is detached once the new one holds everything; detaching
    /// the new one cancels the replace.
    replaced: BTreeMap<u64, u64>,
    /// What the retire agent leaves alone until `pool clear` or the next import (spare.rs):
    /// spares whose activation failed (a dead device is not tried after every sync, and the
    /// next spare is), leaves whose spare was detached by hand (not put back at once), and
    /// leaves whose autoreplace failed.
    retire_skip: RetireSkip,
    /// Leaves that were a top-level vdev of their own until an attach or a replace made them
    /// a mirror's first child ([`Pool::install_attach`]): the next sync flushes each alone
    /// before its uberblock, and fails if one fails ([`Pool::sync_uberblock`]). Blocks written
    /// in place before the attach (an indirect log record's, a receive's) went to that leaf
    /// alone, unflushed, and the new child never had them; a mirror's flush succeeds on any
    /// one child's word, so the new child's empty flush would cover a failed one of the leaf
    /// that holds them.
    flush_alone: Vec<Arc<Leaf>>,
}

/// A leaf's counts as a txg opened ([`PoolState::missed_when_opened`]).
#[derive(Clone, Copy, Debug)]
struct OpenedCounts {
    /// [`Leaf::writes_missed`]: a leaf whose count has not moved since txg T opened missed
    /// no block born in T or later.
    writes: u64,
    /// [`Leaf::copies_missed`]: a leaf whose count has not moved since txg T opened holds a
    /// copy of every block its vdev wrote since, flushed once a flush after the writes
    /// succeeded ([`Pool::sync_uberblock`] checks it).
    copies: u64,
}

/// See [`PoolState::retire_skip`].
#[derive(Debug, Default)]
struct RetireSkip {
    spares: std::collections::BTreeSet<u64>,
    leaves: std::collections::BTreeSet<u64>,
    autoreplace: std::collections::BTreeSet<u64>,
}

/// How `pool status` names top-level vdev `index`: `mirror-N`, `log-mirror-N`, `raidzP-N`,
/// `disk-N` or `log-N`.
fn top_name(index: usize, config: &TopConfig) -> String {
    match (&config.raidz, config.kind, config.log) {
        (Some(raidz), ..) => format!("raidz{}-{index}", raidz.parity),
        (None, TopKind::Mirror, false) => format!("mirror-{index}"),
        (None, TopKind::Mirror, true) => format!("log-mirror-{index}"),
        (None, _, true) => format!("log-{index}"),
        (None, _, false) => format!("disk-{index}"),
    }
}

/// Txgs whose [`PoolState::missed_when_opened`] counts are kept.
const OPENED_TXGS_KEPT: usize = 8;

impl PoolState {
    /// Whether `leaf` is present, in service and holds every synced txg: a copy of everything
    /// its vdev stores, to serve from or resilver from.
    fn holds_all(&self, leaf: &PoolLeaf) -> bool {
        leaf.present
            && !leaf.leaf.is_out_of_service()
            && self.leaf_txg.get(&leaf.guid).copied().unwrap_or(0) >= self.uberblock.txg
    }

    /// Whether `leaf`, of the top-level vdev whose leaves are `top`, holds a flushed copy of
    /// every block its vdev wrote since txg `txg` opened (after a flush that followed them)
    /// and is in service: it was in the tree then (a leaf that joined its vdev since missed
    /// what came before it; a vdev added since had nothing before) and has missed no copy
    /// since ([`Leaf::copies_missed`]). None: it holds them; else why not.
    fn lacks_copies_since(
        &self,
        txg: u64,
        leaf: &PoolLeaf,
        top: &[&PoolLeaf],
    ) -> Option<&'static str> {
        // Without a record of the txg (a pool synced without a store noting its txgs), the
        // counts at the end of the last sync stand in for it.
        let (recorded, then) = match self.missed_when_opened.get(&txg) {
            Some(counts) => (
                top.iter().any(|l| counts.contains_key(&l.guid)),
                counts.get(&leaf.guid).map(|c| c.copies),
            ),
            None => (
                top.iter().any(|l| self.leaf_copies.contains_key(&l.guid)),
                self.leaf_copies.get(&leaf.guid).copied(),
            ),
        };
        let then = if recorded { then } else { Some(0) };
        if !leaf.present {
            Some("missing")
        } else if leaf.leaf.is_out_of_service() {
            Some("out of service")
        } else if then.is_none() {
            Some("joined after the txg opened")
        } else if then != Some(leaf.leaf.copies_missed()) {
            Some("missed a write or a flush (failed, or out of service meanwhile)")
        } else {
            None
        }
    }

    /// [`Leaf::writes_missed`] of `leaf` when txg `txg` opened, if known; else at the end of
    /// the last sync (a pool synced without a store noting its txgs).
    fn missed_since(&self, txg: u64, leaf: &PoolLeaf) -> u64 {
        self.missed_when_opened
            .get(&txg)
            .and_then(|counts| counts.get(&leaf.guid))
            .map(|c| c.writes)
            .or_else(|| self.leaf_missed.get(&leaf.guid).copied())
            .unwrap_or(0)
    }
}

/// The pool's vdev tree as it stands: the configuration its labels carry, the tree I/O goes
/// through, and its leaves.
#[derive(Debug)]
pub struct VdevTree {
    pub config: VdevTreeConfig,
    pub root: Root,
    pub leaves: Vec<PoolLeaf>,
    /// The available hot spares (spare.rs); one in use is among `leaves`.
    pub spares: Vec<spare::SpareLeaf>,
}

/// A part of the vdev tree that was current when the view was taken; the view keeps that
/// tree alive, so it stays valid across a change of leaves.
pub struct TreeView<T: ?Sized + 'static> {
    tree: Arc<VdevTree>,
    part: fn(&VdevTree) -> &T,
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for TreeView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized> std::ops::Deref for TreeView<T> {
    type Target = T;

    fn deref(&self) -> &T {
        (self.part)(&self.tree)
    }
}

/// An open pool.
#[derive(Debug)]
pub struct Pool {
    env: Env,
    name: String,
    guid: u64,
    ashift: u8,
    tree: RwLock<Arc<VdevTree>>,
    state: Mutex<PoolState>,
    cache: BlockCache,
    /// Held across an administrative change's check and its effect (`admin.rs`), so two at
    /// once cannot both pass "another copy is in service" and take both out.
    admin: Mutex<()>,
    /// For the leaves and mirrors a change of leaves builds (`attach.rs`).
    tunables: Tunables,
    /// The next leaf's [`VdevId`]: ids are never reused within an import.
    next_leaf_id: std::sync::atomic::AtomicU32,
    /// Set for an import's dry run: nothing is written, bad copies included (`set_read_only`).
    read_only: std::sync::atomic::AtomicBool,
    /// The block pipeline's faults, observers and error counts (crate::zio).
    zio: Arc<crate::zio::Pipeline>,
    /// What happened to the pool while this process had it (`pool events`).
    events: Arc<crate::fm::Events>,
    /// The pool's properties (props.rs).
    properties: Mutex<props::Properties>,
}

fn check_name(name: &str) -> Result<(), PoolError> {
    let invalid = |reason| PoolError::InvalidName { name: name.to_owned(), reason };
    if name.is_empty() || name.len() > POOL_NAME_BYTES_MAX {
        return Err(invalid("it must be 1 to 64 bytes long"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(invalid("it must start with a letter"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)) {
        return Err(invalid("use only letters, digits and _ - . :"));
    }
    Ok(())
}

impl Pool {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool's events ([`crate::fm`]).
    pub fn events(&self) -> &Arc<crate::fm::Events> {
        &self.events
    }

    pub fn guid(&self) -> u64 {
        self.guid
    }

    pub fn ashift(&self) -> u8 {
        self.ashift
    }

    /// The vdev tree as it stands now.
    pub fn tree(&self) -> Arc<VdevTree> {
        Arc::clone(&self.tree.read())
    }

    /// The I/O tree of [`Pool::tree`].
    pub fn root(&self) -> TreeView<Root> {
        TreeView { tree: self.tree(), part: |tree| &tree.root }
    }

    /// The leaves of [`Pool::tree`].
    pub fn leaves(&self) -> TreeView<[PoolLeaf]> {
        TreeView { tree: self.tree(), part: |tree| tree.leaves.as_slice() }
    }

    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The configuration of [`Pool::tree`], as the labels carry it.
    pub fn config(&self) -> TreeView<VdevTreeConfig> {
        TreeView { tree: self.tree(), part: |tree| &tree.config }
    }

    /// Leaves in service that are behind the pool and can be brought up to date (another leaf
    /// of their mirror is in service to copy from): each one's guid, the newest txg it is
    /// known to hold, and its [`Leaf::writes_missed`] when the txg after the last synced one
    /// opened (what [`Pool::mark_caught_up`] compares). A lone leaf that missed a write has
    /// no other copy to take it from.
    pub fn leaves_behind(&self) -> Vec<(u64, u64, u64)> {
        let tree = self.tree();
        let state = self.state.lock();
        let txg = state.uberblock.txg;
        let held = |l: &PoolLeaf| state.leaf_txg.get(&l.guid).copied().unwrap_or(0);
        let serving = |l: &PoolLeaf| l.present && !l.leaf.is_out_of_service();
        // Whether the rest of the leaf's vdev serves every block: another leaf of a mirror; on
        // RAID-Z, all but at most `parity` columns.
        let others_serve = |l: &PoolLeaf| {
            tree.config.top[l.top].serves_with(|guid| {
                guid != l.guid && tree.leaves.iter().any(|o| o.guid == guid && serving(o))
            })
        };
        tree.leaves
            .iter()
            .filter(|l| serving(l) && held(l) < txg)
            .filter(|l| others_serve(l))
            .map(|l| (l.guid, held(l), state.missed_since(txg + 1, l)))
            .collect()
    }

    /// Records [`Leaf::writes_missed`] and [`Leaf::copies_missed`] of every leaf as txg `txg`
    /// becomes the open one (the store calls this when it quiesces `txg - 1`).
    pub fn note_txg_open(&self, txg: u64) {
        let counts = (self.leaves().iter())
            .map(|l| {
                let counts =
                    OpenedCounts { writes: l.leaf.writes_missed(), copies: l.leaf.copies_missed() };
                (l.guid, counts)
            })
            .collect();
        let mut state = self.state.lock();
        state.missed_when_opened.insert(txg, counts);
        while state.missed_when_opened.len() > OPENED_TXGS_KEPT {
            state.missed_when_opened.pop_first();
        }
    }

    /// Records that the leaf with guid `guid` now holds everything up to `txg` (after a
    /// resilver).
    fn mark_complete(&self, guid: u64, txg: u64) {
        let leaves = self.leaves();
        let mut state = self.state.lock();
        let held = state.leaf_txg.entry(guid).or_insert(0);
        *held = (*held).max(txg);
        let synced = state.uberblock.txg;
        Self::mark_behind(&leaves, &state, synced);
    }

    /// After a resilver copied onto the leaf with guid `guid` every block born up to txg
    /// `resilvered` (a synced txg: nothing born then is written any more), the leaf holds
    /// everything up to it. If it has also missed no write since the txg after it opened
    /// (`missed_then`, from [`Pool::leaves_behind`] when `resilvered` was the last synced
    /// txg), it holds every synced txg, and the syncs advance it again; returns whether it
    /// does. The caller holds the store's sync lock, so no sync is between writing uberblocks
    /// and counting who took them.
    pub fn mark_caught_up(&self, guid: u64, resilvered: u64, missed_then: u64) -> bool {
        let leaves = self.leaves();
        let Some(leaf) = leaves.iter().find(|l| l.guid == guid) else { return false };
        let missed = leaf.leaf.writes_missed();
        let current = missed == missed_then && !leaf.leaf.is_out_of_service();
        let mut state = self.state.lock();
        let txg = if current { state.uberblock.txg } else { resilvered };
        let held = state.leaf_txg.entry(guid).or_insert(0);
        *held = (*held).max(txg);
        if current {
            state.leaf_missed.insert(guid, missed);
        }
        let synced = state.uberblock.txg;
        Self::mark_behind(&leaves, &state, synced);
        current
    }

    /// Tells each leaf of a mirror whether it misses txgs up to `synced` (mirror reads go to
    /// it last). A lone leaf is all there is: never marked.
    fn mark_behind(leaves: &[PoolLeaf], state: &PoolState, synced: u64) {
        for leaf in leaves {
            let mirrored = leaves.iter().any(|o| o.top == leaf.top && o.guid != leaf.guid);
            let held = state.leaf_txg.get(&leaf.guid).copied().unwrap_or(0);
            leaf.leaf.set_behind(mirrored && leaf.present && held < synced);
        }
    }

    /// The uberblock of the last synced txg.
    pub fn uberblock(&self) -> Uberblock {
        self.state.lock().uberblock
    }

    /// Every valid uberblock found at import, newest first (one per txg): the txgs a rewind
    /// can return to.
    pub fn uberblocks_found(&self) -> Vec<Uberblock> {
        self.state.lock().found.clone()
    }

    /// Opens the pool read-only (`true`) or writable: while read-only, reads that find a bad
    /// mirror copy or a bad copy of a metadata block leave it as it is. An import's dry run
    /// reads this way; nothing else writes until the store is opened.
    pub fn set_read_only(&self, read_only: bool) {
        self.root().set_repairs(!read_only);
        self.read_only.store(read_only, std::sync::atomic::Ordering::Relaxed);
    }

    /// Log groups in flight per top-level vdev under the auto commit policy; 0 (`auto`) lets
    /// the intent log choose from the devices (`intent_log.groups_per_vdev`).
    pub fn log_groups_per_vdev(&self) -> u32 {
        let groups = self.tunables.get(crate::tunables::Tunable::IntentLogGroupsPerVdev);
        u32::try_from(groups).unwrap_or(0)
    }

    /// Copies each indirect block and space-map piece is written with (`pool.metadata_copies`);
    /// the pool directory gets one more.
    pub fn metadata_copies(&self) -> usize {
        self.tunables.get(crate::tunables::Tunable::PoolMetadataCopies) as usize
    }

    /// Makes `uberblock`, an older one found at import, the pool's newest: the uberblocks of
    /// later txgs are erased from every present leaf's label rings (and flushed), so that no
    /// later import returns to the abandoned txgs, whose trees do not verify. The next sync
    /// writes `uberblock.txg + 1`.
    pub async fn rewind_to(&self, uberblock: Uberblock) -> Result<(), PoolError> {
        let abandoned: Vec<u64> = {
            let state = self.state.lock();
            assert!(
                state.found.iter().any(|u| u.txg == uberblock.txg),
                "rewind to txg {} that import did not find",
                uberblock.txg
            );
            state.found.iter().map(|u| u.txg).filter(|&t| t > uberblock.txg).collect()
        };
        // Each slot is read first and blanked only if it holds an abandoned txg: a slot's txg
        // is its number modulo the ring, so going by number alone could blank the very txg
        // rewound to. A leaf that cannot be written is left as it is, as an uberblock write
        // does, but every top-level vdev must keep at least one leaf that took the erasure.
        let blank = SharedBuf::copy_from(&[0u8; UBERBLOCK_BYTES]);
        let tree = self.tree();
        // A hole has no leaf to erase anything on, and nothing to erase.
        let mut erased_tops: Vec<bool> =
            tree.config.top.iter().map(|t| t.kind == TopKind::Hole).collect();
        for pool_leaf in tree.leaves.iter().filter(|l| l.present) {
            let mut ok = true;
            for label in label_offsets(pool_leaf.leaf.device().len_bytes()) {
                for &txg in &abandoned {
                    let at = uberblock_offset(label, txg);
                    let slot = pool_leaf.leaf.read(at, UBERBLOCK_BYTES as u32, IoClass::SyncRead);
                    let holds_abandoned = match slot.await {
                        Ok(bytes) => Uberblock::decode(&bytes)
                            .is_ok_and(|u| u.pool_guid == self.guid && u.txg > uberblock.txg),
                        Err(_) => true,
                    };
                    if holds_abandoned {
                        ok &= pool_leaf
                            .leaf
                            .write(at, blank.clone(), IoClass::SyncWrite)
                            .await
                            .is_ok();
                    }
                }
            }
            erased_tops[pool_leaf.top] |= ok;
        }
        if let Some(top) = erased_tops.iter().position(|&erased| !erased) {
            return Err(PoolError::RewindNotRecorded { pool: self.name.clone(), top });
        }
        self.flush_all().await?;
        let mut state = self.state.lock();
        state.uberblock = uberblock;
        state.found.retain(|u| u.txg <= uberblock.txg);
        for txg in state.leaf_txg.values_mut() {
            *txg = (*txg).min(uberblock.txg);
        }
        Self::mark_behind(&tree.leaves, &state, uberblock.txg);
        Ok(())
    }

    /// Top-level vdevs that are separate log devices.
    pub fn log_vdevs(&self) -> Vec<u32> {
        let tree = self.tree();
        (0..tree.config.top.len() as u32).filter(|&i| tree.config.top[i as usize].log).collect()
    }

    /// Each top-level vdev's data space `[start, end)`: where its blocks may be allocated.
    pub fn data_areas(&self) -> Vec<(u64, u64)> {
        self.root().top_level().iter().map(Vdev::data_area).collect()
    }

    /// The pool's size as `pool list` gives it: the data areas of its top-level vdevs that
    /// hold data (not separate log devices), in allocatable bytes.
    pub fn data_capacity_bytes(&self) -> u64 {
        let logs = self.log_vdevs();
        (self.data_areas().iter().enumerate())
            .filter(|(index, _)| !logs.contains(&(*index as u32)))
            .map(|(_, (start, end))| end - start)
            .sum()
    }

    /// Each top-level vdev's RAID-Z shape (`None` for the others): what the allocator needs to
    /// know of how blocks lie.
    pub fn geometries(&self) -> Vec<Option<RaidzGeometry>> {
        self.root()
            .top_level()
            .iter()
            .map(|vdev| match vdev {
                Vdev::Raidz(raidz) => Some(raidz.geometry()),
                _ => None,
            })
            .collect()
    }

    /// The most a block of `psize` bytes allocates on any data vdev (whole sectors, and on
    /// RAID-Z its parity and padding).
    pub fn asize_max(&self, psize: u64) -> u64 {
        let tree = self.tree();
        let unit = 1u64 << self.ashift;
        tree.root
            .top_level()
            .iter()
            .zip(&tree.config.top)
            .filter(|(_, config)| !config.log && config.kind != TopKind::Hole)
            .map(|(vdev, _)| vdev.asize(psize.max(1), u32::from(self.ashift)))
            .max()
            .unwrap_or_else(|| psize.max(1).next_multiple_of(unit))
    }

    /// The largest block that an allocation of `asize` bytes on top-level vdev `vdev` holds.
    pub fn max_psize(&self, vdev: u32, asize: u64) -> u64 {
        match self.root().top_level().get(vdev as usize) {
            Some(Vdev::Raidz(raidz)) => raidz.geometry().max_psize(asize),
            _ => asize,
        }
    }

    /// `bytes` of blocks of `block_bytes` each, as the space they allocate at most: themselves
    /// on a pool of leaves and mirrors, with parity and padding where a data vdev is RAID-Z.
    pub fn inflate(&self, bytes: u64, block_bytes: u64) -> u64 {
        if !self.has_raidz() {
            return bytes;
        }
        let block = block_bytes.max(1);
        let cost = self.asize_max(block);
        (u128::from(bytes) * u128::from(cost)).div_ceil(u128::from(block)) as u64
    }

    /// `raw` allocated bytes as the blocks of `block_bytes` they hold at most (what `zfs list`
    /// shows, there for 128 KiB blocks; here for the volume's own): the same on a pool of
    /// leaves and mirrors, less the parity and padding such blocks cost on RAID-Z.
    pub fn deflate(&self, raw: u64, block_bytes: u64) -> u64 {
        if !self.has_raidz() {
            return raw;
        }
        let block = block_bytes.max(1);
        let cost = self.asize_max(block);
        (u128::from(raw) * u128::from(block) / u128::from(cost)) as u64
    }

    /// Whether a top-level vdev is RAID-Z.
    pub fn has_raidz(&self) -> bool {
        self.root().top_level().iter().any(|v| matches!(v, Vdev::Raidz(_)))
    }

    /// Where on each leaf of top-level vdev `top` its intent-log region lies: (device offset,
    /// bytes). A RAID-Z vdev's region is spread over its children, row by row.
    pub(crate) fn leaf_log_region(&self, top: usize) -> (u64, u64) {
        log_region_of(&self.root().top_level()[top], self.ashift)
    }

    fn device_error(&self, path: &str, source: DeviceError) -> PoolError {
        PoolError::Device { pool: self.name.clone(), path: path.to_owned(), cause: source }
    }

    /// Creates a pool on the given devices, with every optional feature ([`NewFeatures::ALL`]).
    pub async fn create(env: &Env, spec: PoolSpec, tunables: &Tunables) -> Result<Pool, PoolError> {
        Pool::create_as(env, spec, tunables, NewFeatures::ALL).await
    }

    /// As [`Pool::create`], with only the optional features `features` names: a pool older
    /// builds read (`pool create -d`), and tests of pools such builds made, which later
    /// builds must go on reading.
    pub async fn create_as(
        env: &Env,
        spec: PoolSpec,
        tunables: &Tunables,
        features: NewFeatures,
    ) -> Result<Pool, PoolError> {
        let log_layout =
            if features.raidz_log_copies { RaidzLayout::Copies } else { RaidzLayout::Striped };
        check_name(&spec.name)?;
        let pool = spec.name.clone();
        let layout = |reason: String| PoolError::InvalidLayout { pool: pool.clone(), reason };
        if spec.top.is_empty() {
            return Err(layout("a pool needs at least one leaf or mirror".into()));
        }
        let mut rng = env.unique_rng(&format!("pool_create/{}", spec.name));
        let mut guid = || loop {
            let g = rng.u64();
            if g != 0 {
                break g;
            }
        };
        let pool_guid = guid();
        let mut ashift = spec.ashift.clamp(9, 16);
        let mut seen_paths = std::collections::HashSet::new();
        let mut tops = Vec::new();
        let mut spare_specs = Vec::new();
        // Each leaf named once and large enough; the allocation unit at least its sectors.
        let mut check_leaf = |leaf: &LeafSpec, ashift: &mut u8| -> Result<(), PoolError> {
            if !seen_paths.insert(leaf.path.clone()) {
                return Err(layout(format!("leaf {} is named twice", leaf.path)));
            }
            let len = leaf.device.len_bytes();
            if len < LEAF_BYTES_MIN {
                return Err(PoolError::LeafTooSmall {
                    pool: pool.clone(),
                    path: leaf.path.clone(),
                    len_bytes: len,
                    min_bytes: LEAF_BYTES_MIN,
                });
            }
            *ashift = (*ashift).max(leaf.device.sector_bytes().trailing_zeros() as u8);
            Ok(())
        };
        for top in &spec.top {
            let (kind, log, leaves, parity) = match top {
                TopSpec::Spare(leaves) => {
                    for leaf in leaves {
                        // A spare must be able to stand in for any leaf: its sectors count.
                        check_leaf(leaf, &mut ashift)?;
                        spare_specs.push(leaf.clone());
                    }
                    continue;
                }
                TopSpec::Leaf(leaf) => (TopKind::Leaf, false, vec![leaf.clone()], 0),
                TopSpec::Mirror(leaves) => (TopKind::Mirror, false, leaves.clone(), 0),
                TopSpec::Raidz { parity, leaves } => {
                    let width = u32::try_from(leaves.len()).unwrap_or(u32::MAX);
                    // The sector size is not known yet; the shape's checks do not depend on it.
                    RaidzGeometry::new(width, u32::from(*parity), 9)
                        .map_err(|error| layout(error.to_string()))?;
                    (TopKind::Raidz, false, leaves.clone(), *parity)
                }
                TopSpec::Log(inner) => match inner.as_ref() {
                    TopSpec::Leaf(leaf) => (TopKind::Leaf, true, vec![leaf.clone()], 0),
                    TopSpec::Mirror(leaves) => (TopKind::Mirror, true, leaves.clone(), 0),
                    TopSpec::Raidz { .. } => {
                        return Err(layout(String::from(
                            "a log device cannot be RAID-Z (use a leaf or a mirror)",
                        )))
                    }
                    TopSpec::Log(_) | TopSpec::Spare(_) => {
                        return Err(layout(String::from(
                            "a log device is a leaf or a mirror of leaves",
                        )))
                    }
                },
            };
            if kind == TopKind::Mirror && !(2..=MIRROR_CHILDREN_MAX).contains(&leaves.len()) {
                return Err(layout(format!(
                    "a mirror needs 2 to {MIRROR_CHILDREN_MAX} leaves, got {}",
                    leaves.len()
                )));
            }
            for leaf in &leaves {
                check_leaf(leaf, &mut ashift)?;
            }
            // A RAID-Z vdev uses every child up to the smallest one's data area: its address
            // space is the children side by side, and fixed for its life.
            let raidz = (kind == TopKind::Raidz).then(|| RaidzConfig {
                parity,
                child_end_bytes: leaves
                    .iter()
                    .map(|l| sluice_format::data_end_bytes(l.device.len_bytes()))
                    .min()
                    .unwrap_or(0),
                replacing: Vec::new(),
                // Log blocks as copies: a 4 KiB write's is `parity + 1` writes, as on a mirror
                // of that many (sluice_format::raidz's module doc).
                log_copies: log_layout == RaidzLayout::Copies,
            });
            let top_guid = guid();
            let children: Vec<(LeafConfig, LeafSpec)> = leaves
                .into_iter()
                .map(|l| (LeafConfig { guid: guid(), path: l.path.clone() }, l))
                .collect();
            tops.push((kind, log, top_guid, children, raidz));
        }
        let spares: Vec<SpareLeaf> = spare_specs
            .into_iter()
            .map(|l| SpareLeaf { guid: guid(), path: l.path, device: Some(l.device) })
            .collect();
        let config = VdevTreeConfig {
            spares: spares
                .iter()
                .map(|s| sluice_format::SpareConfig {
                    guid: s.guid,
                    path: s.path.clone(),
                    stands_in_for: 0,
                })
                .collect(),
            top: tops
                .iter()
                .map(|(kind, log, guid, children, raidz)| TopConfig {
                    kind: *kind,
                    log: *log,
                    guid: *guid,
                    children: children.iter().map(|(c, _)| c.clone()).collect(),
                    raidz: raidz.clone(),
                })
                .collect(),
            encryption: false,
            properties: false,
            // A new pool stores its indirect blocks compressed unless made for older builds,
            // which refuse it by the feature's name.
            lz4_indirect: features.lz4_indirect,
        };
        if let Err(cause) = config.encode() {
            return Err(layout(format!(
                "the vdev tree does not fit in a label ({cause}); use fewer leaves in a vdev or \
                 shorter paths"
            )));
        }
        let members: Vec<Member> = tops
            .iter()
            .enumerate()
            .flat_map(|(top, (_, _, _, children, _))| {
                children.iter().map(move |(c, l)| (top, c.clone(), Arc::clone(&l.device), true))
            })
            .collect();
        if config.top.iter().all(|t| t.log) {
            return Err(layout(String::from("a pool needs a data vdev besides its log devices")));
        }
        let pool = Pool::assemble(
            env,
            &spec.name,
            pool_guid,
            ashift,
            (config, members, spares),
            tunables,
        )?;
        // Labels first, then the first uberblock: a leaf with a label but no uberblock is
        // recognisably a half-created pool, never a valid one. A spare has labels only.
        let mut writes = Vec::new();
        let tree = pool.tree();
        for spare in &tree.spares {
            pool.write_spare_labels(spare, &tree.config, 1).await?;
        }
        for pool_leaf in &tree.leaves {
            let header = pool.label_header(pool_leaf, 1);
            let bytes = header
                .encode()
                .map_err(|source| PoolError::Format { pool: pool.name.clone(), cause: source })?;
            let data = SharedBuf::copy_from(&bytes);
            for offset in label_offsets(pool_leaf.leaf.device().len_bytes()) {
                let leaf = Arc::clone(&pool_leaf.leaf);
                let data = data.clone();
                let path = pool_leaf.path.clone();
                writes.push(async move {
                    leaf.write(offset, data, IoClass::SyncWrite).await.map_err(|e| (path, e))
                });
            }
        }
        for result in join_all(writes).await {
            result.map_err(|(_, source)| PoolError::Vdev {
                pool: pool.name.clone(),
                cause: source,
            })?;
        }
        // Each vdev's log region is written once now, so log writes never allocate
        // (crate::alloc, "log region").
        let prepares = tree.leaves.iter().map(|pool_leaf| {
            let (start, region) = pool.leaf_log_region(pool_leaf.top);
            let (device, vdev) = (Arc::clone(pool_leaf.leaf.device()), pool_leaf.leaf.id());
            async move {
                device.prepare_log_region(start, region).await.map_err(|source| (vdev, source))
            }
        });
        for result in join_all(prepares).await {
            result.map_err(|(vdev, source)| PoolError::Vdev {
                pool: pool.name.clone(),
                cause: VdevError::Device { vdev, cause: source },
            })?;
        }
        let first = Uberblock {
            txg: 1,
            pool_guid,
            guid_sum: pool.guid_sum(),
            timestamp_secs: 0,
            root: None,
            complete_txg: 1,
        };
        pool.write_uberblock(first).await?;
        pool.state.lock().uberblock = first;
        Ok(pool)
    }

    fn guid_sum(&self) -> u64 {
        self.leaves().iter().fold(0u64, |sum, l| sum.wrapping_add(l.guid))
    }

    fn label_header(&self, pool_leaf: &PoolLeaf, config_txg: u64) -> LabelHeader {
        self.label_header_for(pool_leaf, &self.config(), config_txg)
    }

    /// Builds the in-memory vdev tree.
    fn assemble(
        env: &Env,
        name: &str,
        guid: u64,
        ashift: u8,
        (config, members, spares): (VdevTreeConfig, Vec<Member>, Vec<SpareLeaf>),
        tunables: &Tunables,
    ) -> Result<Pool, PoolError> {
        let mut leaves = Vec::new();
        // Each top's leaves in `config_leaves` order (members come in that order).
        let mut by_top: BTreeMap<usize, Vec<Arc<Leaf>>> = BTreeMap::new();
        let next_leaf_id = u32::try_from(members.len()).unwrap_or(u32::MAX);
        let events = Arc::new(crate::fm::Events::new(env, name));
        for (index, (top, leaf_config, device, present)) in members.into_iter().enumerate() {
            let id = u32::try_from(index).unwrap_or(u32::MAX);
            let leaf = Leaf::new(VdevId(id), env, device, tunables);
            leaf.watch(Arc::clone(&events), &leaf_config.path);
            if !present {
                // Stand-ins start faulted: mirrors read them only as a last resort.
                leaf.mark_gone();
            }
            by_top.entry(top).or_default().push(Arc::clone(&leaf));
            leaves.push(PoolLeaf {
                guid: leaf_config.guid,
                top,
                path: leaf_config.path,
                leaf,
                present,
            });
        }
        let top = config
            .top
            .iter()
            .enumerate()
            .map(|(index, top)| {
                let children = by_top.remove(&index).unwrap_or_default();
                build_vdev(index, top, children, ashift, env, tunables)
            })
            .collect::<Option<Vec<Vdev>>>()
            .ok_or_else(|| PoolError::InvalidLayout {
                pool: name.to_owned(),
                reason: "a top-level vdev has no leaf".into(),
            })?;
        Ok(Pool {
            env: env.clone(),
            name: name.to_owned(),
            guid,
            ashift,
            tree: RwLock::new(Arc::new(VdevTree { config, root: Root::new(top), leaves, spares })),
            admin: Mutex::new(()),
            tunables: tunables.clone(),
            next_leaf_id: std::sync::atomic::AtomicU32::new(next_leaf_id),
            read_only: std::sync::atomic::AtomicBool::new(false),
            zio: Arc::default(),
            events,
            properties: Mutex::default(),
            state: Mutex::new(PoolState {
                uberblock: Uberblock {
                    txg: 0,
                    pool_guid: guid,
                    guid_sum: 0,
                    timestamp_secs: 0,
                    root: None,
                    complete_txg: 0,
                },
                found: Vec::new(),
                leaf_txg: BTreeMap::new(),
                leaf_missed: BTreeMap::new(),
                missed_when_opened: BTreeMap::new(),
                leaf_copies: BTreeMap::new(),
                offline_kept: Default::default(),
                replaced: Default::default(),
                retire_skip: Default::default(),
                flush_alone: Vec::new(),
            }),
            cache: BlockCache::new(
                tunables.cache_bytes(crate::rt::machine_memory_bytes()),
                tunables.choice(crate::tunables::Tunable::CacheContents) == "all",
            ),
        })
    }

    /// Makes `root` the root of a new txg, durably; returns the txg. Fails, committing
    /// nothing, when a vdev cannot serve the txg's blocks from flushed copies
    /// ([`PoolError::NotDurable`]).
    pub async fn sync_uberblock(&self, root: Option<BlockPointer>) -> Result<u64, PoolError> {
        let txg = self.state.lock().uberblock.txg + 1;
        self.flush_alone().await?;
        self.flush_all().await?;
        self.check_copies(txg)?;
        let timestamp_secs = self.env.now().as_nanos() / 1_000_000_000;
        let uberblock = Uberblock {
            txg,
            pool_guid: self.guid,
            guid_sum: self.guid_sum(),
            timestamp_secs,
            root,
            complete_txg: txg,
        };
        self.write_uberblock(uberblock).await?;
        self.state.lock().uberblock = uberblock;
        Ok(txg)
    }

    /// Writes `uberblock` into every label's ring of every present leaf, then flushes. At least
    /// one leaf of every top-level vdev must take it and flush it.
    ///
    /// A leaf's complete-txg advances to this txg only if it was complete up to the txg
    /// before and missed no write since this txg opened; a mirror leaf that is behind stays
    /// behind until a resilver catches it up ([`Pool::mark_caught_up`]). (A lone leaf
    /// advances whenever it took the sync without missing a write: it is all there is.) The
    /// uberblock still goes to a leaf that is behind, so that a pool imported with only that
    /// leaf finds the newest txg and reports the blocks it misses, rather than opening an
    /// older txg without a word; its copy's `complete_txg` keeps what it actually holds, so
    /// an import after a crash or an export resilvers it from there.
    async fn write_uberblock(&self, uberblock: Uberblock) -> Result<(), PoolError> {
        let tree = self.tree();
        // Each leaf's copy says which txgs that leaf holds: this one if it held the txg before
        // and missed no write since this txg opened, else what it held already.
        let complete: Vec<u64> = {
            let state = self.state.lock();
            let previous = state.uberblock.txg;
            let lone = |l: &PoolLeaf| tree.leaves.iter().filter(|o| o.top == l.top).count() == 1;
            tree.leaves
                .iter()
                .map(|l| {
                    let held = state.leaf_txg.get(&l.guid).copied().unwrap_or(0);
                    let whole = (lone(l) || held >= previous)
                        && l.leaf.writes_missed() == state.missed_since(uberblock.txg, l)
                        && !l.leaf.is_out_of_service();
                    if whole {
                        uberblock.txg
                    } else {
                        held.min(uberblock.txg)
                    }
                })
                .collect()
        };
        // Whose copies go missing from here on: a leaf that took the uberblock but whose flush
        // failed or was skipped holds it only in a cache a power loss empties.
        let copies_missed: Vec<u64> = tree.leaves.iter().map(|l| l.leaf.copies_missed()).collect();
        // A leaf out of service (offline, or faulted) is sent nothing, uberblocks included.
        let writes = tree.leaves.iter().zip(&complete).filter(|(l, _)| l.present).map(
            |(pool_leaf, &complete_txg)| {
                let data = SharedBuf::copy_from(&Uberblock { complete_txg, ..uberblock }.encode());
                async move {
                    let mut ok = false;
                    for label in label_offsets(pool_leaf.leaf.device().len_bytes()) {
                        if pool_leaf.leaf.is_out_of_service() {
                            break;
                        }
                        let at = uberblock_offset(label, uberblock.txg);
                        // The sync-write class, as ZFS writes labels: the sync waits on it,
                        // and the async class is left to blocks (what iostat sizes).
                        ok |= pool_leaf
                            .leaf
                            .write(at, data.clone(), IoClass::SyncWrite)
                            .await
                            .is_ok();
                    }
                    (pool_leaf.guid, ok)
                }
            },
        );
        let results = join_all(writes).await;
        self.flush_all().await?;
        let took = |leaf: &PoolLeaf| results.iter().any(|&(guid, ok)| guid == leaf.guid && ok);
        {
            let mut state = self.state.lock();
            for (pool_leaf, &complete_txg) in tree.leaves.iter().zip(&complete) {
                let ok = took(pool_leaf);
                let missed = pool_leaf.leaf.writes_missed();
                let missed_before = state.missed_since(uberblock.txg, pool_leaf);
                state.leaf_missed.insert(pool_leaf.guid, missed);
                // A copy that claimed the txg but then missed a write (an uberblock write
                // failed) is overstated on that leaf; its other labels' copies of older txgs
                // are not, and a resilver started now catches it up either way.
                if ok
                    && complete_txg == uberblock.txg
                    && missed == missed_before
                    && !pool_leaf.leaf.is_out_of_service()
                {
                    state.leaf_txg.insert(pool_leaf.guid, uberblock.txg);
                }
            }
            Self::mark_behind(&tree.leaves, &state, uberblock.txg);
        }
        for (top, config) in tree.config.top.iter().enumerate() {
            let leaves =
                || tree.leaves.iter().zip(&copies_missed).filter(move |(l, _)| l.top == top);
            if config.kind == TopKind::Hole {
                continue;
            }
            if !leaves().any(|(l, _)| took(l)) {
                let path = leaves().next().map(|(l, _)| l.path.clone()).unwrap_or_default();
                return Err(self.device_error(&path, DeviceError::Gone { device: path.clone() }));
            }
            let flushed = |l: &PoolLeaf, &before: &u64| {
                l.leaf.copies_missed() == before && !l.leaf.is_out_of_service()
            };
            // A log device holds no block of the txg, and its leaves' flushes are the intent
            // log's too (one failing there makes the log fall back to a sync, this one): it
            // needs only to have taken the uberblock.
            if !config.log && !leaves().any(|(l, before)| took(l) && flushed(l, before)) {
                let leaves = leaves()
                    .map(|(l, before)| {
                        let why = match (took(l), flushed(l, before)) {
                            (false, _) => "its uberblock write failed",
                            (true, false) => "its flush failed or was skipped",
                            (true, true) => "holds it",
                        };
                        format!("{}: {why}", l.path)
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(PoolError::NotDurable {
                    pool: self.name.clone(),
                    txg: uberblock.txg,
                    vdev: top_name(top, config),
                    columns: None,
                    what: "a flushed copy of the txg's uberblock",
                    leaves,
                });
            }
        }
        let mut state = self.state.lock();
        for pool_leaf in &tree.leaves {
            state.leaf_copies.insert(pool_leaf.guid, pool_leaf.leaf.copies_missed());
        }
        Ok(())
    }

    /// Flushes each leaf an attach left waiting for it ([`PoolState::flush_alone`]), alone; a
    /// failure is the sync's, and the leaves wait for the next one.
    async fn flush_alone(&self) -> Result<(), PoolError> {
        let leaves = std::mem::take(&mut self.state.lock().flush_alone);
        if leaves.is_empty() {
            return Ok(());
        }
        let flushed = join_all(leaves.iter().map(|leaf| leaf.flush())).await;
        if let Some(Err(source)) = flushed.into_iter().find(Result::is_err) {
            self.state.lock().flush_alone.extend(leaves);
            return Err(PoolError::Vdev { pool: self.name.clone(), cause: source });
        }
        Ok(())
    }

    /// After the flush before txg `txg`'s uberblock: every top-level vdev that holds blocks
    /// can serve what it took since the txg opened from leaves that hold a flushed copy of
    /// it ([`PoolState::lacks_copies_since`]): on a mirror one such leaf, on RAID-Z all but
    /// `parity` columns. A mirror's write succeeds when one child took it and its flush when
    /// one child flushed, so those answers alone would count as durable a block one leaf
    /// failed to write followed by a flush only that leaf completed. Log devices hold no
    /// block of the txg (a log block that missed a leaf failed its write).
    fn check_copies(&self, txg: u64) -> Result<(), PoolError> {
        let tree = self.tree();
        let state = self.state.lock();
        for (top, config) in tree.config.top.iter().enumerate().filter(|(_, c)| !c.log) {
            let leaves: Vec<&PoolLeaf> = tree.leaves.iter().filter(|l| l.top == top).collect();
            let lacks = |l: &PoolLeaf| state.lacks_copies_since(txg, l, &leaves);
            let holds = |guid: u64| leaves.iter().any(|l| l.guid == guid && lacks(l).is_none());
            if config.serves_with(holds) {
                continue;
            }
            let columns = config.raidz.as_ref().map(|raidz| {
                let width = config.children.len() as u16;
                (width - u16::from(raidz.parity), width)
            });
            let leaves = leaves
                .iter()
                .map(|l| format!("{}: {}", l.path, lacks(l).unwrap_or("holds it")))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(PoolError::NotDurable {
                pool: self.name.clone(),
                txg,
                vdev: top_name(top, config),
                columns,
                what: "a flushed copy of every block written since the txg opened",
                leaves,
            });
        }
        Ok(())
    }

    /// Flushes every top-level vdev; a top-level vdev none of whose leaves flushed is an error.
    async fn flush_all(&self) -> Result<(), PoolError> {
        self.root()
            .flush()
            .await
            .map_err(|source| PoolError::Vdev { pool: self.name.clone(), cause: source })
    }

    /// Flushes everything and closes the pool.
    pub async fn export(self) -> Result<(), PoolError> {
        self.flush_all().await
    }

    /// Opens the pool called `name` (or with guid `guid`) from the given devices.
    pub async fn import(
        env: &Env,
        candidates: Vec<LeafSpec>,
        name: &str,
        tunables: &Tunables,
    ) -> Result<Pool, PoolError> {
        let searched = candidates.len();
        // The newest valid label header of each device; devices whose labels a newer sluice
        // wrote, with the newest version found.
        let mut labelled: Vec<(LabelHeader, LeafSpec)> = Vec::new();
        let mut newer: Vec<(String, u16)> = Vec::new();
        for candidate in candidates {
            if let Some(header) = read_best_label(candidate.device.as_ref()).await {
                labelled.push((header, candidate));
            } else if let Some(version) = newer_label_version(candidate.device.as_ref()).await {
                newer.push((candidate.path.clone(), version));
            }
        }
        let not_found = || match newer.iter().map(|(_, v)| *v).max() {
            None => PoolError::NotFound { name: name.to_owned(), searched },
            Some(version) => PoolError::NewerLabels {
                name: name.to_owned(),
                searched,
                leaves: newer.iter().map(|(path, _)| path.as_str()).collect::<Vec<_>>().join(", "),
                version,
                readable: LABEL_VERSION as u16,
            },
        };
        let wanted: Vec<&(LabelHeader, LeafSpec)> = labelled
            .iter()
            .filter(|(h, _)| h.pool_name == name || format!("{:016x}", h.pool_guid) == name)
            .collect();
        let mut guids: Vec<u64> = wanted.iter().map(|(h, _)| h.pool_guid).collect();
        guids.sort_unstable();
        guids.dedup();
        let pool_guid = match guids.as_slice() {
            [] => return Err(not_found()),
            [one] => *one,
            _ => return Err(PoolError::Ambiguous { name: name.to_owned(), guids }),
        };
        let members: Vec<&(LabelHeader, LeafSpec)> =
            wanted.into_iter().filter(|(h, _)| h.pool_guid == pool_guid).collect();
        // The newest config; on a tie a member's label (an available spare's has top-level
        // guid 0, and its size says nothing of the vdevs').
        let newest = (members.iter())
            .max_by_key(|(h, _)| (h.config_txg, h.top_guid != 0))
            .map(|(h, _)| h.clone());
        let Some(header) = newest else {
            return Err(PoolError::NotFound { name: name.to_owned(), searched });
        };
        let mut assembled = Vec::new();
        for (top_index, top) in header.config.top.iter().enumerate() {
            if top.kind == TopKind::Hole {
                continue;
            }
            let mut present_any = false;
            let mut missing = Vec::new();
            let mut present_guids = Vec::new();
            for child in config_leaves(top) {
                match members.iter().find(|(h, _)| h.leaf_guid == child.guid) {
                    Some((_, spec)) => {
                        present_any = true;
                        present_guids.push(child.guid);
                        assembled.push((
                            top_index,
                            LeafConfig { guid: child.guid, path: spec.path.clone() },
                            Arc::clone(&spec.device),
                            true,
                        ));
                    }
                    None => {
                        missing.push(child.path.clone());
                        // As large as the largest leaf found of its vdev, so that the vdev's
                        // data area is what it was (a mirror's is its smallest child's).
                        let siblings = config_leaves(top)
                            .filter_map(|c| members.iter().find(|(h, _)| h.leaf_guid == c.guid))
                            .map(|(h, _)| h.leaf_bytes)
                            .max();
                        let stand_in: Arc<dyn BlockDevice> = Arc::new(MissingDevice {
                            name: child.path.clone(),
                            len_bytes: siblings.unwrap_or(header.leaf_bytes),
                        });
                        assembled.push((top_index, child.clone(), stand_in, false));
                    }
                }
            }
            // A RAID-Z vdev rebuilds at most `parity` columns: a column is there when its
            // child or the leaf replacing it is.
            let columns_missing = top.columns_lacking(|guid| present_guids.contains(&guid));
            if let Some(raidz) =
                top.raidz.as_ref().filter(|r| columns_missing > usize::from(r.parity))
            {
                return Err(PoolError::RaidzColumnsMissing {
                    pool: header.pool_name.clone(),
                    top: top_index,
                    parity: raidz.parity,
                    columns: columns_missing,
                    need: columns_missing - usize::from(raidz.parity),
                    missing: missing.join(", "),
                });
            }
            if !present_any {
                return Err(PoolError::MissingLeaves {
                    pool: header.pool_name.clone(),
                    top: top_index,
                    missing: missing.join(", "),
                });
            }
        }
        // Available spares, found by their labels like members; one not found is listed as
        // missing and never used.
        let spares = (header.config.spares.iter())
            .filter(|s| s.stands_in_for == 0)
            .map(|s| {
                let found = members.iter().find(|(h, _)| h.leaf_guid == s.guid);
                SpareLeaf {
                    guid: s.guid,
                    path: found.map_or_else(|| s.path.clone(), |(_, spec)| spec.path.clone()),
                    device: found.map(|(_, spec)| Arc::clone(&spec.device)),
                }
            })
            .collect();
        let pool = Pool::assemble(
            env,
            &header.pool_name,
            pool_guid,
            header.ashift,
            (header.config.clone(), assembled, spares),
            tunables,
        )?;
        let mut best: Option<Uberblock> = None;
        let mut found = Vec::new();
        let mut leaf_txg = BTreeMap::new();
        for pool_leaf in pool.leaves().iter().filter(|l| l.present) {
            for uberblock in read_uberblocks(pool_leaf.leaf.device().as_ref()).await {
                if uberblock.pool_guid != pool_guid {
                    continue;
                }
                // What the leaf holds is what its newest copy says.
                let newest = leaf_txg.entry(pool_leaf.guid).or_insert((0, 0));
                if uberblock.txg > newest.0 {
                    *newest = (uberblock.txg, uberblock.complete_txg);
                }
                if best.is_none_or(|b| uberblock.txg > b.txg) {
                    best = Some(uberblock);
                }
                found.push(uberblock);
            }
        }
        let Some(uberblock) = best else {
            return Err(PoolError::NoUberblock { pool: pool.name.clone() });
        };
        found.sort_by_key(|u| std::cmp::Reverse(u.txg));
        found.dedup_by_key(|u| u.txg);
        let leaves = pool.leaves();
        let mut state = pool.state.lock();
        state.leaf_txg = leaf_txg.into_iter().map(|(guid, (_, held))| (guid, held)).collect();
        state.uberblock = uberblock;
        state.found = found;
        Self::mark_behind(&leaves, &state, uberblock.txg);
        drop(state);
        Ok(pool)
    }
}

/// The newest label header on a device that decodes, if any.
pub(super) async fn read_best_label(device: &dyn BlockDevice) -> Option<LabelHeader> {
    let mut best: Option<LabelHeader> = None;
    for offset in label_offsets(device.len_bytes()) {
        if offset + LABEL_BYTES > device.len_bytes() {
            continue;
        }
        let Ok(bytes) = device.read_at(offset, LABEL_HEADER_BYTES as u32).await else { continue };
        if let Ok(header) = LabelHeader::decode(&bytes) {
            if best.as_ref().is_none_or(|b| header.config_txg > b.config_txg) {
                best = Some(header);
            }
        }
    }
    best
}

/// The newest label format version on `device` that this build cannot read, if any: labels a
/// newer sluice wrote (sluice's magic, a version beyond [`LABEL_VERSION`]), so that
/// import and `pool create` can say so rather than find nothing there.
pub(super) async fn newer_label_version(device: &dyn BlockDevice) -> Option<u16> {
    let mut newest = None;
    for offset in label_offsets(device.len_bytes()) {
        if offset + LABEL_BYTES > device.len_bytes() {
            continue;
        }
        let Ok(bytes) = device.read_at(offset, LABEL_HEADER_BYTES as u32).await else { continue };
        // A version below the newest this build reads (0, say) is damage, not a newer sluice.
        if let Err(FormatError::UnsupportedVersion { found, .. }) = LabelHeader::decode(&bytes) {
            if found > LABEL_VERSION as u16 {
                newest = newest.max(Some(found));
            }
        }
    }
    newest
}

/// Every uberblock that decodes in any label ring of a device.
pub(super) async fn read_uberblocks(device: &dyn BlockDevice) -> Vec<Uberblock> {
    let mut found = Vec::new();
    let ring_bytes = UBERBLOCK_SLOTS * UBERBLOCK_BYTES as u64;
    for label in label_offsets(device.len_bytes()) {
        let start = uberblock_offset(label, 0);
        let Ok(ring) = device.read_at(start, ring_bytes as u32).await else { continue };
        for slot in ring.chunks_exact(UBERBLOCK_BYTES) {
            if let Ok(uberblock) = Uberblock::decode(slot) {
                found.push(uberblock);
            }
        }
    }
    found
}
