//! Scrub (ZFS: `dsl_scan.c`): read every copy of every block the newest uberblock reaches and
//! repair the bad ones.
//!
//! The walk starts at the uberblock's root (the pool directory), visits each top-level vdev's
//! space map, each volume's tree and the dedup table's tree, indirect blocks before the blocks under them. Every copy
//! on every mirror child is read at scrub priority and checked against the checksum in its
//! parent pointer; bad copies are rewritten from a good one. A block with no good copy anywhere
//! is reported, and scrub goes on with the rest.

use sluice_format::{BlockKind, BlockPointer, PoolDirectory, BLKPTR_BYTES};

use super::{Pool, PoolError};
use crate::tunables::IoClass;
use crate::vdev::{ScrubOutcome, VdevId};

/// What a scrub found and fixed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub blocks: u64,
    pub bytes: u64,
    /// Copies that failed to read or verify.
    pub errors: u64,
    /// Copies rewritten from a good one.
    pub repaired: u64,
    /// Blocks with no good copy (data lost unless restored from elsewhere).
    pub unrecoverable: Vec<BlockPointer>,
}

impl Pool {
    async fn scrub_block(&self, bp: &BlockPointer, report: &mut ScrubReport) {
        report.blocks += 1;
        report.bytes += bp.psize_bytes();
        let outcome = self.scan_block(bp, &[]).await;
        report.errors += u64::from(outcome.errors);
        report.repaired += u64::from(outcome.repaired);
        if outcome.unrecoverable {
            report.unrecoverable.push(*bp);
        }
    }

    /// Checks every copy of one block (a scrub: `targets` empty) or copies it onto the
    /// `targets` leaves (a resilver), for the background scan (crate::txg::dsl_scan).
    pub async fn scan_block(&self, bp: &BlockPointer, targets: &[VdevId]) -> ScrubOutcome {
        let verify = |bytes: &[u8]| bp.verifies(bytes);
        let len = u32::try_from(bp.psize_bytes()).unwrap_or(u32::MAX);
        let mut total = ScrubOutcome::default();
        let mut good = None;
        let mut lost = Vec::new();
        let root = self.root();
        for dva in bp.copies() {
            let Some(vdev) = root.top_level().get(dva.vdev as usize) else { continue };
            let outcome = if targets.is_empty() {
                vdev.scrub(dva.offset_bytes(), len, &verify).await
            } else {
                vdev.resilver(dva.offset_bytes(), len, &verify, targets).await
            };
            total.errors += outcome.errors;
            total.repaired += outcome.repaired;
            if outcome.unrecoverable {
                lost.push(*dva);
            } else {
                good.get_or_insert(*dva);
            }
        }
        // A copy no child of its vdev holds intact is rewritten from another copy (a scrub
        // only: a resilver copies within each vdev).
        if let (Some(good), false, true) = (good, lost.is_empty(), targets.is_empty()) {
            let at =
                crate::vdev::VdevAddress { vdev: good.vdev, offset_bytes: good.offset_bytes() };
            if let Ok(bytes) = root.read(at, len, IoClass::Scrub, &verify).await {
                total.repaired += self.heal_copies(&lost, &bytes).await;
            }
        }
        total.unrecoverable = good.is_none() && bp.copies().next().is_some();
        total
    }

    /// Copies `run`, blocks that lie back to back on one vdev, onto the `targets` leaves as
    /// one read and one write (a resilver after a sequential rewrite meets long runs of them;
    /// block by block, it spent its time per I/O). Returns the outcome when the run was read
    /// whole from a child on which every block verifies; `None` otherwise, and the caller goes
    /// block by block (a source child's bad copy is then counted a second time).
    pub async fn resilver_span(
        &self,
        run: &[BlockPointer],
        targets: &[VdevId],
    ) -> Option<ScrubOutcome> {
        let first = run.first()?.copies().next()?;
        let len: u64 = run.iter().map(BlockPointer::psize_bytes).sum();
        let verify = |bytes: &[u8]| {
            let mut at = 0usize;
            run.iter().all(|bp| {
                let n = bp.psize_bytes() as usize;
                let ok = bytes.get(at..at + n).is_some_and(|b| bp.verifies(b));
                at += n;
                ok
            })
        };
        let root = self.root();
        let vdev = root.top_level().get(first.vdev as usize)?;
        let len = u32::try_from(len).ok()?;
        let outcome = vdev.resilver(first.offset_bytes(), len, &verify, targets).await;
        (outcome.errors == 0 && !outcome.unrecoverable).then_some(outcome)
    }

    /// Scrubs everything the newest uberblock reaches.
    pub async fn scrub(&self) -> Result<ScrubReport, PoolError> {
        self.scan(0).await
    }

    /// Resilvers the leaves that are behind (returned after being missing, or that missed
    /// writes): only blocks born after the oldest such leaf's last complete txg are visited,
    /// and a subtree born before it is skipped whole, since copy-on-write gives a parent a
    /// birth txg no older than any of its children. Each visited block is checked on every
    /// mirror child and rewritten where stale. Returns `None` when no leaf is behind.
    pub async fn resilver(&self) -> Result<Option<ScrubReport>, PoolError> {
        let behind = self.leaves_behind();
        let Some(since) = behind.iter().map(|&(_, txg, _)| txg).min() else { return Ok(None) };
        let txg = self.uberblock().txg;
        let report = self.scan(since + 1).await?;
        if report.unrecoverable.is_empty() {
            for (guid, _, _) in behind {
                self.mark_complete(guid, txg);
            }
        }
        Ok(Some(report))
    }

    /// Visits every reachable block born at or after `min_birth`.
    async fn scan(&self, min_birth: u64) -> Result<ScrubReport, PoolError> {
        let mut report = ScrubReport::default();
        let Some(root) = self.uberblock().root else { return Ok(report) };
        self.scrub_block(&root, &mut report).await;
        if !report.unrecoverable.is_empty() {
            return Ok(report);
        }
        let bytes = self.read_block(&root, IoClass::Scrub).await?;
        let directory = PoolDirectory::decode(&bytes)
            .map_err(|source| PoolError::Format { pool: self.name().to_owned(), cause: source })?;
        let pieces = directory.volumes.iter().flat_map(|v| v.deadlist_pieces());
        for bp in directory.space_maps.iter().flatten().chain(pieces) {
            if bp.birth_txg >= min_birth {
                self.scrub_block(bp, &mut report).await;
            }
        }
        // Depth-first over each volume's trees (its snapshots', then its own), with an
        // explicit stack (no async recursion); a tree's blocks shared with the one before it
        // were visited there. The dedup table's tree too: its buckets are leaves here (the
        // blocks their entries name are reached through the volumes that share them).
        let trees = directory.volumes.iter().flat_map(|v| v.trees());
        let mut stack: Vec<(BlockPointer, u64)> = trees
            .filter_map(|t| t.root.map(|root| (root, t.shared_through)))
            .chain(directory.ddt.root.map(|root| (root, 0)))
            .collect();
        while let Some((bp, shared_through)) = stack.pop() {
            if bp.birth_txg < min_birth || bp.birth_txg <= shared_through {
                continue;
            }
            let before = report.unrecoverable.len();
            self.scrub_block(&bp, &mut report).await;
            if bp.kind != BlockKind::Indirect || report.unrecoverable.len() > before {
                continue;
            }
            // Its pointers as they decode: decompressed (indirect blocks are stored lz4), and
            // above encrypted blocks their MACs checked. One that fails is lost with what it
            // points at; the scrub goes on with the rest.
            let Ok(bytes) = self.read_block_logical(&bp, IoClass::Scrub).await else {
                report.unrecoverable.push(bp);
                continue;
            };
            for slot in bytes.chunks_exact(BLKPTR_BYTES) {
                if let Ok(Some(child)) = BlockPointer::decode(slot) {
                    stack.push((child, shared_through));
                }
            }
        }
        Ok(report)
    }
}

/// What [`Pool::verify_txg`] found: the blocks of one txg's tree that no copy verifies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Blocks read and verified.
    pub blocks: u64,
    pub bytes: u64,
    /// Blocks with no copy that reads and verifies, with what the read said; the walk does not
    /// descend below a damaged indirect block.
    pub damaged: Vec<(BlockPointer, String)>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty()
    }
}

/// Blocks one verification reads concurrently.
const VERIFY_READS_IN_FLIGHT: usize = 32;

impl Pool {
    /// Reads every block of the tree under `root` (a txg's pool directory) born after
    /// `min_birth`, data blocks included, and checks each against its pointer (ZFS:
    /// `spa_load_verify`). Copy-on-write gives a parent a birth txg no older than any of its
    /// children, so a subtree born at or before `min_birth` is skipped whole: with `min_birth`
    /// just below the deferral window, this checks exactly the blocks a disk that lied about
    /// its flushes could have lost; with 0, the whole tree. Any copy that verifies will do (a
    /// mirror heals the others unless the pool is read-only).
    pub async fn verify_txg(
        &self,
        root: &BlockPointer,
        min_birth: u64,
    ) -> Result<VerifyReport, PoolError> {
        use futures::StreamExt;
        let mut report = VerifyReport::default();
        let directory = match self.read_block(root, IoClass::SyncRead).await {
            Ok(bytes) => PoolDirectory::decode(&bytes).map_err(|source| PoolError::Format {
                pool: self.name().to_owned(),
                cause: source,
            })?,
            Err(error) => {
                report.damaged.push((*root, error.to_string()));
                return Ok(report);
            }
        };
        report.blocks += 1;
        report.bytes += root.psize_bytes();
        let mut level: Vec<BlockPointer> = directory
            .space_maps
            .iter()
            .flatten()
            .copied()
            .chain(directory.volumes.iter().flat_map(|v| v.deadlist_pieces()).copied())
            .chain(directory.volumes.iter().flat_map(|v| v.trees()).filter_map(|t| t.root))
            .chain(directory.ddt.root)
            .filter(|bp| bp.birth_txg > min_birth)
            .collect();
        // Breadth first, each level's blocks read concurrently.
        while !level.is_empty() {
            let reads = futures::stream::iter(
                level
                    .drain(..)
                    .map(|bp| async move { (bp, self.read_block(&bp, IoClass::SyncRead).await) }),
            )
            .buffer_unordered(VERIFY_READS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
            for (bp, read) in reads {
                let bytes = match read {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        report.damaged.push((bp, error.to_string()));
                        continue;
                    }
                };
                report.blocks += 1;
                report.bytes += bp.psize_bytes();
                if bp.kind != BlockKind::Indirect {
                    continue;
                }
                // Its pointers as they decode: decompressed (indirect blocks are stored lz4).
                let bytes = match crate::zio::unseal(self.zio().keys(), &bp, bytes) {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        report.damaged.push((bp, self.undecodable(&bp, error).to_string()));
                        continue;
                    }
                };
                for slot in bytes.chunks_exact(BLKPTR_BYTES) {
                    match BlockPointer::decode(slot) {
                        Ok(Some(child)) if child.birth_txg > min_birth => level.push(child),
                        Ok(_) => {}
                        Err(error) => {
                            report.damaged.push((bp, error.to_string()));
                            break;
                        }
                    }
                }
            }
        }
        Ok(report)
    }
}
