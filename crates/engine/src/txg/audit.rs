//! A full check of a quiet store's space and references (ZFS: `zdb -b`, leak detection).
//!
//! Every block the last synced txg reaches is found by walking it: the directory, the space-map
//! pieces, each volume's tree and its snapshots' trees (a block shared with the tree before
//! counted once), the dead lists' pieces and the dedup table's tree. Each volume's blocks must
//! also be owned exactly once: their bytes equal what its tree references plus what its dead
//! lists hold, each list's figures match its entries, and no entry is younger than the
//! snapshot that holds it. A dedup data block is counted once,
//! however many pointers share it, and the pointers are counted per key. Then two books must
//! balance: the space the allocator holds as allocated (neither free, nor log, nor waiting out
//! a deferral) equals the space of the blocks found, and each dedup entry's refcount equals the
//! pointers found for its key. No volume holds a data block past its end, and each indirect
//! block's fill is the number of data blocks under it. Tests run it after every crash and
//! import.

use std::collections::{BTreeMap, BTreeSet};

use sluice_format::{BlockPointer, DdtKey, Deadlist, VolumeSpace};

use super::dsl_deadlist::{count_entry, dead_bytes, range_bytes};
use super::dsl_synctask::range_starts;

use super::spa::Spa;
use super::{Store, StoreError};
use crate::objset;

/// What [`Store::audit`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Bytes of the blocks reached from the last synced txg.
    pub referenced_bytes: u64,
    /// Bytes the allocator holds as allocated.
    pub allocated_bytes: u64,
    /// Bytes the allocator holds for the intent log (live log blocks, blocks written in place
    /// for indirect records, and log blocks waiting out a free's deferral).
    pub log_bytes: u64,
    /// Bytes the volumes' log chains hold now (issued blocks still needed and each chain's
    /// next block). Equal to `log_bytes` once frees have waited out their deferral.
    pub chain_bytes: u64,
    pub dedup_entries: u64,
    pub dedup_references: u64,
    /// Each inconsistency, in words; empty when the books balance.
    pub problems: Vec<String>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Store {
    /// Audits space and dedup references. The store must be quiet: synced, with nothing
    /// written since (as right after an import).
    pub async fn audit(&self) -> Result<AuditReport, StoreError> {
        let (roots, space_maps, directory) = {
            let dsl = self.dsl.read();
            let dirty = dsl.values().any(|d| {
                let v = d.state.lock();
                !v.open.is_empty() || !v.syncing.is_empty()
            });
            assert!(!dirty, "audit of a store with unsynced writes");
            let roots: Vec<_> = dsl
                .values()
                .map(|d| {
                    let v = d.state.lock();
                    (v.entry.clone(), v.entry.root, v.disk_levels)
                })
                .collect();
            let (space_maps, directory) = self.syncer.synced_metadata();
            (roots, space_maps, directory)
        };
        let mut report = AuditReport::default();
        let mut blocks: BTreeSet<(u32, u64, u32)> = BTreeSet::new();
        let mut add = |bp: &BlockPointer, report: &mut AuditReport| {
            for dva in bp.copies() {
                if !blocks.insert((dva.vdev, dva.offset_sectors, dva.asize_sectors)) {
                    report.problems.push(format!(
                        "block at vdev {} sector {} is referenced twice without dedup",
                        dva.vdev, dva.offset_sectors
                    ));
                }
                report.referenced_bytes += dva.asize_bytes();
            }
        };
        for bp in directory.iter().chain(space_maps.iter().flatten()) {
            add(bp, &mut report);
        }
        let mut pointers: BTreeMap<DdtKey, (u64, BlockPointer)> = BTreeMap::new();
        for (entry, root, levels) in roots {
            // Bytes of the blocks the volume's trees hold that no tree before holds; of its
            // own tree's, those a clone's origin holds.
            let (mut owned, mut from_origin) = (0u64, 0u64);
            let origin_txg = entry.origin.map_or(0, |o| o.txg);
            for (i, tree) in entry.trees().into_iter().enumerate() {
                let snapshot = entry.snapshots.get(i);
                let what = match snapshot {
                    Some(s) => format!("snapshot {}@{}", entry.name, s.name),
                    None => format!("volume {}", entry.name),
                };
                let blocks = tree.size_bytes / u64::from(entry.block_bytes);
                let mut space = VolumeSpace::default();
                // The volume's own tree as on disk (a grow adds its levels at the next sync).
                let (root, levels) =
                    if snapshot.is_none() { (root, levels) } else { (tree.root, tree.levels) };
                let walked = objset::walk(self.spa.pool(), root, levels).await?;
                report.problems.extend(fill_problems(&what, &walked));
                for (level, index, bp) in walked {
                    objset::add_space(&mut space, &bp, true);
                    if snapshot.is_none() && bp.birth_txg <= origin_txg {
                        from_origin += dead_bytes(&bp);
                    }
                    if level == 0 && index >= blocks {
                        report.problems.push(format!(
                            "{what} holds block {index} past its end ({blocks} blocks)"
                        ));
                    }
                    if bp.birth_txg <= tree.shared_through {
                        // The tree before holds it at the same place.
                        continue;
                    }
                    owned += dead_bytes(&bp);
                    match bp.dedup {
                        Some(key) => pointers.entry(key).or_insert((0, bp)).0 += 1,
                        None => add(&bp, &mut report),
                    }
                }
                // The figures each sync keeps by adding what it wrote and taking away what it
                // replaced must be what the tree holds.
                let counted = snapshot.map_or(entry.space, |s| Some(s.space));
                if counted != Some(space) {
                    report
                        .problems
                        .push(format!("{what} counts {counted:?}, its tree holds {space:?}"));
                }
            }
            for bp in entry.deadlist_pieces() {
                add(bp, &mut report);
            }
            let held = audit_deadlists(&self.spa, &entry, &mut report).await?;
            let referenced = entry.space.map_or(0, |s| s.referenced_bytes);
            if owned + from_origin != referenced + held {
                report.problems.push(format!(
                    "volume {}: its trees hold {owned} bytes of their own and {from_origin} of \
                     its origin's, but it references {referenced} and its dead lists hold \
                     {held} of their own",
                    entry.name
                ));
            }
        }
        let (entries, table_blocks) = self.spa.ddt().stored(self.spa.pool()).await?;
        for bp in &table_blocks {
            add(bp, &mut report);
        }
        let header = self.spa.ddt().synced_header();
        for entry in &entries {
            report.dedup_entries += 1;
            report.dedup_references += entry.refcount;
            add(&entry.bp, &mut report);
            match pointers.remove(&entry.key) {
                Some((found, bp)) if found == entry.refcount && bp.dvas == entry.bp.dvas => {}
                Some((found, _)) => report.problems.push(format!(
                    "dedup entry {:02x?} counts {} references, the volumes hold {found}",
                    &entry.key.0[..6],
                    entry.refcount
                )),
                None => report.problems.push(format!(
                    "dedup entry {:02x?} counts {} references, the volumes hold none (leaked)",
                    &entry.key.0[..6],
                    entry.refcount
                )),
            }
        }
        for (key, (found, _)) in pointers {
            report.problems.push(format!(
                "{found} dedup pointers name key {:02x?}, which the table does not hold",
                &key.0[..6]
            ));
        }
        if (report.dedup_entries, report.dedup_references) != (header.entries, header.references) {
            report.problems.push(format!(
                "the dedup header counts {} entries and {} references, the table holds {} and {}",
                header.entries, header.references, report.dedup_entries, report.dedup_references
            ));
        }
        report.chain_bytes = {
            let dsl = self.dsl.read();
            dsl.values().filter_map(|d| d.state.lock().log.as_ref().map(|l| l.held_bytes())).sum()
        };
        let (area, free, log, deferred) = self.spa.allocator().lock().accounting();
        report.log_bytes = log;
        if log < report.chain_bytes {
            report.problems.push(format!(
                "the volumes' log chains hold {} bytes, the allocator only {log}",
                report.chain_bytes
            ));
        }
        report.allocated_bytes = area - free - log - deferred;
        if report.allocated_bytes != report.referenced_bytes {
            report.problems.push(format!(
                "the allocator holds {} bytes allocated, the blocks found take {} ({} leaked)",
                report.allocated_bytes,
                report.referenced_bytes,
                report.allocated_bytes as i128 - report.referenced_bytes as i128
            ));
        }
        Ok(report)
    }
}

/// Checks each dead list of `entry` against its entries; returns the bytes they hold that
/// are the volume's own (not a clone's origin's).
async fn audit_deadlists(
    spa: &Spa,
    entry: &sluice_format::VolumeEntry,
    report: &mut AuditReport,
) -> Result<u64, StoreError> {
    let starts = range_starts(entry.origin, &entry.snapshots);
    let origin_txg = entry.origin.map_or(0, |o| o.txg);
    // Each list with the txg of the snapshot that holds its blocks (0: none may).
    let mut lists: Vec<(String, &Deadlist, u64)> = Vec::new();
    for (i, snapshot) in entry.snapshots.iter().enumerate() {
        let holder = i.checked_sub(1).map_or(origin_txg, |p| entry.snapshots[p].txg);
        lists.push((format!("{}@{}", entry.name, snapshot.name), &snapshot.deadlist, holder));
    }
    lists.push((entry.name.clone(), &entry.deadlist, entry.prev_snap_txg));
    let mut held = 0;
    for (name, list, holder) in lists {
        let entries = super::dsl_deadlist::entries(spa, list).await?;
        let mut counted = Deadlist::default();
        for bp in &entries {
            count_entry(&mut counted, &starts, bp);
            if bp.birth_txg > holder {
                report.problems.push(format!(
                    "the dead list of {name} holds a block born in txg {}, after its \
                     snapshot's txg {holder}",
                    bp.birth_txg
                ));
            }
        }
        if counted.buckets != list.buckets {
            report.problems.push(format!(
                "the dead list of {name} counts {:?} by birth range, its entries {:?}",
                list.buckets, counted.buckets
            ));
        }
        // A clone's entries born by its origin's txg are the origin's.
        let origins = if entry.origin.is_some() { range_bytes(list, 0) } else { 0 };
        held += list.bytes() - origins;
    }
    Ok(held)
}

/// An indirect block's fill must be the number of data blocks under it: each sync sums it from
/// the slots it rebuilds, and nothing on the read path checks it.
fn fill_problems(what: &str, walked: &[(u8, u64, BlockPointer)]) -> Vec<String> {
    let mut data: Vec<u64> =
        walked.iter().filter(|(level, _, _)| *level == 0).map(|(_, index, _)| *index).collect();
    data.sort_unstable();
    walked
        .iter()
        .filter(|(level, _, _)| *level > 0)
        .filter_map(|(level, first, bp)| {
            let end = first.saturating_add(objset::span_of(*level));
            let under =
                (data.partition_point(|&i| i < end) - data.partition_point(|&i| i < *first)) as u64;
            (bp.fill != under).then(|| {
                format!(
                    "{what}: the level-{level} block over blocks {first}.. has fill {}, but \
                     {under} data blocks lie under it",
                    bp.fill
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use sluice_format::{
        BlockCompression, BlockCrypt, BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva,
    };

    fn pointer(level: u8, fill: u64) -> BlockPointer {
        BlockPointer {
            dvas: [
                Dva { vdev: 0, asize_sectors: 4, offset_sectors: 64 },
                Dva::default(),
                Dva::default(),
            ],
            lsize_sectors: 4,
            psize_sectors: 4,
            birth_txg: 5,
            checksum_alg: ChecksumAlg::Xxh3_128,
            compression: BlockCompression::None,
            kind: if level == 0 { BlockKind::Data } else { BlockKind::Indirect },
            level,
            fill,
            checksum: Checksum([1; 16]),
            dedup: None,
            crypt: BlockCrypt::None,
        }
    }

    /// A tree of two levels: the root over two level-1 blocks, one over data blocks 0 and 5,
    /// the other over 130. Right fills pass; a fill off by one at either level is named.
    #[test]
    fn an_indirect_blocks_fill_must_count_the_data_under_it() {
        let tree = |root_fill, left_fill| {
            vec![
                (2, 0, pointer(2, root_fill)),
                (1, 0, pointer(1, left_fill)),
                (0, 0, pointer(0, 1)),
                (0, 5, pointer(0, 1)),
                (1, 128, pointer(1, 1)),
                (0, 130, pointer(0, 1)),
            ]
        };
        assert!(super::fill_problems("volume t/v", &tree(3, 2)).is_empty());
        let wrong = super::fill_problems("volume t/v", &tree(3, 3));
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].contains("level-1 block over blocks 0.. has fill 3, but 2"), "{wrong:?}");
        let wrong = super::fill_problems("volume t/v", &tree(4, 2));
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].contains("level-2 block over blocks 0.. has fill 4, but 3"), "{wrong:?}");
    }
}
