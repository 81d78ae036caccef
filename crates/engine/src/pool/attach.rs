//! Changing which leaves a pool has while it serves (ZFS: `spa_vdev_attach`,
//! `spa_vdev_detach`, `spa_vdev_resilver_done` in `spa.c`; `vdev_config_sync` in
//! `vdev_label.c`).
//!
//! - **attach** adds a leaf to a mirror, or turns a lone leaf into a mirror. The new leaf's
//!   labels are written first (with the new tree and the txg that will first carry it), then
//!   the tree is swapped, and the store syncs that txg at once: every block written from the
//!   swap on reaches the new leaf, everything before is copied by a resilver of every birth
//!   (it holds no txg). The other leaves' labels are rewritten after the sync.
//! - **detach** takes a leaf out of its mirror (a mirror of two becomes a lone leaf with the
//!   same top-level guid); refused when no other leaf of the mirror holds everything, or when
//!   the leaf is its vdev's only one. The tree is swapped, the txg synced, the other leaves'
//!   labels rewritten, and the detached leaf's labels blanked, so neither `pool import` nor a
//!   later probe takes it for a member.
//! - **replace** is an attach whose old leaf is marked as being replaced by the new one: once
//!   the new leaf holds everything (its resilver finished), the old leaf is detached
//!   (crate::txg::spa_vdev). Detaching the new leaf instead cancels the replace.
//!
//! Which leaves are members is decided by the pool directory of the txg the pool opens (its
//! vdev tree, crates/format `directory::records`), not by the labels: a crash between a
//! change's sync and its label rewrite leaves some labels behind, and one before the sync
//! leaves the new leaf's labels ahead. Import builds the tree from the newest label config,
//! which always includes the leaves the directory names (an attached leaf's labels are
//! written before its sync), and [`Pool::adopt_config`] then drops the leaves the directory
//! does not name and rewrites every label, which finishes the interrupted change.
//!
//! Labels are rewritten in two rounds (the first and third label of every leaf, a flush, then
//! the second and fourth, a flush), as ZFS does, so a torn rewrite leaves a whole label at each
//! end of every leaf.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;
use sluice_format::{
    data_end_bytes, label_offsets, LabelHeader, LeafConfig, TopKind, VdevTreeConfig, LABEL_BYTES,
};

use super::missing::MissingDevice;
use super::{LeafSpec, Pool, PoolError, PoolLeaf, SpareLeaf, VdevTree};
use crate::device::SharedBuf;
use crate::tunables::IoClass;
use crate::vdev::{Leaf, LeafState, Root, VdevId, MIRROR_CHILDREN_MAX};

/// A leaf made ready to join the pool ([`Pool::prepare_attach`]), not in its tree yet.
#[derive(Debug)]
pub struct PreparedAttach {
    leaf: PoolLeaf,
    /// The tree it was prepared against, and the tree with it.
    base: VdevTreeConfig,
    config: VdevTreeConfig,
    /// The guid of the leaf it replaces, if it replaces one.
    replaces: Option<u64>,
    existing: String,
    /// A RAID-Z leaf a spare stood in for, which leaves as the new leaf comes (spare.rs).
    dropped: Option<PoolLeaf>,
    /// The old leaf of a replace in place (same path), called PATH/old from now on.
    renamed: Option<u64>,
}

/// Every leaf `top` names, to change.
fn config_leaves_mut(top: &mut sluice_format::TopConfig) -> impl Iterator<Item = &mut LeafConfig> {
    let replacing = top.raidz.iter_mut().flat_map(|r| r.replacing.iter_mut().map(|(_, l)| l));
    top.children.iter_mut().chain(replacing)
}

/// The spare in use standing in for leaf `guid` in `config`, if one does.
fn config_spare_for(config: &VdevTreeConfig, guid: u64) -> Option<u64> {
    config.spares.iter().find(|s| s.stands_in_for == guid).map(|s| s.guid)
}

impl Pool {
    /// Makes `new` ready to join the vdev of the leaf called `existing` (see the module doc):
    /// checks zpool's refusals, writes its labels for `config_txg` (the next txg to sync; the
    /// one that first carries it may be later, which only makes its labels older than they
    /// could be) and prepares its log region, all without holding up syncs. Marks `existing`
    /// as being replaced by it if `replacing`. [`Pool::install_attach`] puts it in the tree.
    pub async fn prepare_attach(
        &self,
        existing: &str,
        new: LeafSpec,
        config_txg: u64,
        replacing: bool,
    ) -> Result<PreparedAttach, PoolError> {
        let (base, config, leaf, replaces) = {
            let _one_change = self.admin.lock();
            let old = self.find_leaf(existing)?;
            let tree = self.tree();
            let action = if replacing { "replace" } else { "attach to" };
            // A disk swapped in place (`zpool replace POOL LEAF`): the new device at the old
            // one's path; the old leaf is then called PATH/old until it leaves, as in ZFS.
            let in_place = replacing && new.path == old.path;
            let taken = tree.leaves.iter().any(|l| l.path == new.path && !in_place)
                || tree.config.spares.iter().any(|s| s.path == new.path && s.stands_in_for == 0);
            if taken {
                return Err(PoolError::AlreadyMember { pool: self.name.clone(), path: new.path });
            }
            let raidz = tree.config.top[old.top].raidz.clone();
            let column = tree.config.top[old.top].children.iter().position(|c| c.guid == old.guid);
            // A RAID-Z leaf a spare stands in for, the spare holding everything: the spare
            // moves into the column and the new leaf replaces it (spare.rs's module doc).
            let spare_in_column = (raidz.as_ref().zip(column)).and_then(|(raidz, c)| {
                let spare = config_spare_for(&tree.config, old.guid)?;
                let in_column = raidz
                    .replacing
                    .iter()
                    .any(|(col, new)| usize::from(*col) == c && new.guid == spare);
                let complete =
                    tree.leaves.iter().any(|l| l.guid == spare && self.state.lock().holds_all(l));
                (replacing && in_column && complete).then_some(spare)
            });
            if let (Some(raidz), None) = (&raidz, spare_in_column) {
                // A RAID-Z child's index is its column: a new leaf can only take over one
                // (replace), never widen the vdev.
                if !replacing {
                    return Err(PoolError::RaidzAttach { pool: self.name.clone(), leaf: old.path });
                }
                let busy = column
                    .is_none_or(|c| raidz.replacing.iter().any(|(col, _)| usize::from(*col) == c));
                if busy {
                    return Err(PoolError::InvalidLayout {
                        pool: self.name.clone(),
                        reason: format!(
                            "{} is being replaced already (or is a replacement); wait for that \
                             replace to finish, or detach its new leaf to cancel it",
                            old.path
                        ),
                    });
                }
            }
            let siblings = tree.leaves.iter().filter(|l| l.top == old.top).count();
            if raidz.is_none() && siblings >= MIRROR_CHILDREN_MAX {
                return Err(PoolError::MirrorFull {
                    pool: self.name.clone(),
                    leaf: old.path.clone(),
                    max: MIRROR_CHILDREN_MAX,
                });
            }
            // What the new leaf copies from: a leaf of the vdev in service with every txg.
            if !self.has_complete_copy(&tree, old.top, None) {
                return Err(PoolError::NoValidReplicas {
                    pool: self.name.clone(),
                    leaf: old.path.clone(),
                    action,
                });
            }
            // The data area the new leaf must hold: its mirror's, or a RAID-Z child's.
            let end = match &raidz {
                Some(raidz) => raidz.child_end_bytes,
                None => self.data_areas()[old.top].1,
            };
            let len = new.device.len_bytes();
            if data_end_bytes(len) < end {
                return Err(PoolError::LeafTooSmall {
                    pool: self.name.clone(),
                    path: new.path,
                    len_bytes: len,
                    min_bytes: end + 2 * LABEL_BYTES,
                });
            }
            let sector = new.device.sector_bytes();
            if sector > 1 << self.ashift {
                return Err(PoolError::SectorTooLarge {
                    pool: self.name.clone(),
                    path: new.path,
                    sector,
                    ashift: self.ashift,
                });
            }
            let guid = self.fresh_guid(&tree);
            let mut config = tree.config.clone();
            let top = &mut config.top[old.top];
            let joining = LeafConfig { guid, path: new.path.clone() };
            if in_place {
                for child in config_leaves_mut(top).filter(|c| c.guid == old.guid) {
                    child.path = format!("{}/old", old.path);
                }
            }
            match (&mut top.raidz, column) {
                (Some(raidz), Some(column)) if spare_in_column.is_some() => {
                    let slot = (raidz.replacing.iter_mut())
                        .find(|(col, _)| usize::from(*col) == column)
                        .expect("found above");
                    let spare = std::mem::replace(&mut slot.1, joining);
                    // It stands in for the new leaf until that holds everything.
                    for entry in config.spares.iter_mut().filter(|s| s.guid == spare.guid) {
                        entry.stands_in_for = guid;
                    }
                    top.children[column] = spare;
                }
                (Some(raidz), Some(column)) => {
                    let column = u16::try_from(column).expect("RAID-Z widths fit a u16");
                    raidz.replacing.push((column, joining));
                }
                _ => {
                    top.kind = TopKind::Mirror;
                    top.children.push(joining);
                }
            }
            let id = VdevId(self.next_leaf_id.fetch_add(1, Ordering::Relaxed));
            let leaf = Leaf::new(id, &self.env, Arc::clone(&new.device), &self.tunables);
            leaf.watch(Arc::clone(&self.events), &new.path);
            let leaf = PoolLeaf { guid, top: old.top, path: new.path, leaf, present: true };
            let replaces = spare_in_column.or(replacing.then_some(old.guid));
            let dropped = spare_in_column.map(|_| old.clone());
            let renamed = in_place.then_some(old.guid);
            (tree.config.clone(), config, leaf, (replaces, dropped, renamed))
        };
        let (replaces, dropped, renamed) = replaces;
        // The new leaf's labels first: a crash before the sync leaves a leaf whose labels
        // name a txg the pool never reached, which import sets aside.
        self.ready_joining_leaf(&leaf, &config, config_txg).await?;
        Ok(PreparedAttach {
            leaf,
            base,
            config,
            replaces,
            existing: existing.to_owned(),
            dropped,
            renamed,
        })
    }

    /// Puts a prepared leaf in the tree; the caller holds the sync lock and syncs next, so
    /// every block from then on reaches it. Refused if the tree changed since, or the copy to
    /// resilver from is gone.
    /// Returns the leaf, and the leaf that left the tree with it (whose labels the caller
    /// blanks after the sync), if one did.
    pub fn install_attach(
        &self,
        prepared: PreparedAttach,
    ) -> Result<(PoolLeaf, Option<PoolLeaf>), PoolError> {
        let PreparedAttach { leaf, base, config, replaces, existing, dropped, renamed } = prepared;
        let _one_change = self.admin.lock();
        let tree = self.tree();
        if tree.config != base {
            return Err(PoolError::InvalidLayout {
                pool: self.name.clone(),
                reason: format!(
                    "the pool's leaves changed while {} was being prepared; try again",
                    leaf.path
                ),
            });
        }
        if !self.has_complete_copy(&tree, leaf.top, None) {
            let action = if replaces.is_some() { "replace" } else { "attach to" };
            return Err(PoolError::NoValidReplicas {
                pool: self.name.clone(),
                leaf: existing,
                action,
            });
        }
        let mut added = BTreeMap::new();
        added.insert(leaf.guid, leaf.clone());
        let mut new_tree = self.build_tree(config, added);
        for old in new_tree.leaves.iter_mut().filter(|l| Some(l.guid) == renamed) {
            old.path = format!("{}/old", old.path);
        }
        if let Some(dropped) = &dropped {
            self.forget_leaves(&[dropped.guid]);
        }
        // A lone leaf in service becoming a mirror's first child: see
        // `PoolState::flush_alone`. (One out of service took no write since it left.)
        let alone = u32::try_from(leaf.top)
            .ok()
            .and_then(|top| self.root().plain_leaf(top))
            .filter(|alone| !alone.is_out_of_service());
        {
            let mut state = self.state.lock();
            state.flush_alone.extend(alone);
            // It holds no txg yet: the resilver copies every birth onto it.
            state.leaf_txg.insert(leaf.guid, 0);
            if let Some(old) = replaces {
                state.replaced.insert(old, leaf.guid);
            }
        }
        self.install(new_tree);
        Ok((leaf, dropped))
    }

    /// Takes the leaf called `name` out of its mirror and swaps the tree (see the module
    /// doc). The caller syncs next, holding the sync lock, then rewrites the labels
    /// ([`Pool::write_labels`]) and blanks the detached leaf's ([`Pool::blank_labels`]),
    /// unless it is a hot spare, which goes back to the available ones (spare.rs): the second
    /// value says so.
    pub fn detach(&self, name: &str) -> Result<(PoolLeaf, bool), PoolError> {
        let _one_change = self.admin.lock();
        let leaf = self.find_leaf(name)?;
        let tree = self.tree();
        let siblings = tree.leaves.iter().filter(|l| l.top == leaf.top).count();
        let raidz = tree.config.top[leaf.top].raidz.clone();
        // On RAID-Z only a replacing pair can lose a member: the old leaf once its
        // replacement holds everything, or the replacement (a cancelled replace).
        let in_pair = raidz.as_ref().is_some_and(|r| {
            r.replacing.iter().any(|(column, new)| {
                new.guid == leaf.guid
                    || tree.config.top[leaf.top].children[usize::from(*column)].guid == leaf.guid
            })
        });
        if siblings < 2 || (raidz.is_some() && !in_pair) {
            return Err(PoolError::NotMirror { pool: self.name.clone(), leaf: leaf.path });
        }
        if !self.has_complete_copy(&tree, leaf.top, Some(leaf.guid)) {
            return Err(PoolError::NoValidReplicas {
                pool: self.name.clone(),
                leaf: leaf.path,
                action: "detach",
            });
        }
        let mut config = tree.config.clone();
        let spare = config.spares.iter().any(|s| s.guid == leaf.guid);
        let replaced_by = self.state.lock().replaced.get(&leaf.guid).copied();
        match (spare, replaced_by) {
            (true, _) => {
                // Detached by hand while the leaf it stood in for still ails: the retire
                // agent leaves that leaf alone (no spare put straight back) until `pool clear`.
                let stood_for = config.spares.iter().find(|s| s.guid == leaf.guid);
                let ailing = stood_for
                    .and_then(|s| tree.leaves.iter().find(|l| l.guid == s.stands_in_for))
                    .filter(|l| {
                        let state = self.state.lock();
                        !(state.holds_all(l) && l.leaf.state() == LeafState::Online)
                    });
                if let Some(ailing) = ailing {
                    self.state.lock().retire_skip.leaves.insert(ailing.guid);
                }
                Pool::return_spare(&mut config, leaf.guid)
            }
            // At the end of its replace: the spare stands in for the new leaf until it goes
            // back (spare.rs), which it may at once, the new leaf holding everything.
            (false, Some(new)) => {
                for entry in config.spares.iter_mut().filter(|s| s.stands_in_for == leaf.guid) {
                    entry.stands_in_for = new;
                }
            }
            // Detached by hand: the spare takes its place for good, as in ZFS.
            (false, None) => config.spares.retain(|s| s.stands_in_for != leaf.guid),
        }
        let top = &mut config.top[leaf.top];
        match &mut top.raidz {
            Some(raidz) => {
                let pair = raidz.replacing.iter().position(|(column, new)| {
                    new.guid == leaf.guid || top.children[usize::from(*column)].guid == leaf.guid
                });
                let (column, new) = raidz.replacing.remove(pair.expect("checked above"));
                // The old leaf leaves: its replacement takes its column.
                if new.guid != leaf.guid {
                    top.children[usize::from(column)] = new;
                }
            }
            None => {
                top.children.retain(|c| c.guid != leaf.guid);
                if top.children.len() == 1 {
                    top.kind = TopKind::Leaf;
                }
            }
        }
        let tree = self.build_tree(config, BTreeMap::new());
        self.forget_leaves(&[leaf.guid]);
        self.install(tree);
        Ok((leaf, spare))
    }

    /// Makes `config`, the vdev tree of the pool directory the store opened, the pool's: leaves
    /// the labels named but the directory does not are dropped (their labels blanked), and
    /// leaves it names that are not here stand in as missing. Returns whether anything
    /// changed; the caller then rewrites every label.
    pub async fn adopt_config(&self, config: &VdevTreeConfig) -> bool {
        let dropped = {
            let _one_change = self.admin.lock();
            let tree = self.tree();
            let members = |c: &VdevTreeConfig| -> Vec<(usize, u64)> {
                let mut all: Vec<(usize, u64)> = c
                    .top
                    .iter()
                    .enumerate()
                    .flat_map(|(t, top)| super::config_leaves(top).map(move |l| (t, l.guid)))
                    .collect();
                all.sort_unstable();
                all
            };
            let kinds = |c: &VdevTreeConfig| c.top.iter().map(|t| t.kind).collect::<Vec<_>>();
            let spares = |c: &VdevTreeConfig| {
                let mut all: Vec<(u64, u64)> =
                    c.spares.iter().map(|s| (s.guid, s.stands_in_for)).collect();
                all.sort_unstable();
                all
            };
            if members(config) == members(&tree.config)
                && kinds(config) == kinds(&tree.config)
                && spares(config) == spares(&tree.config)
            {
                return false;
            }
            let named: Vec<u64> = members(config).into_iter().map(|(_, g)| g).collect();
            let spare_named = |guid: u64| config.spares.iter().any(|s| s.guid == guid);
            // A leaf the directory names only as an available spare (an activation the
            // crash cut short) is not dropped: `build_tree` makes it a spare again.
            let dropped: Vec<PoolLeaf> = (tree.leaves.iter())
                .filter(|l| !named.contains(&l.guid) && !spare_named(l.guid))
                .cloned()
                .collect();
            // Spares the labels listed and the directory does not (an add the crash cut
            // short, a remove that did not rewrite the labels): blanked, never used.
            let dropped_spares: Vec<SpareLeaf> =
                tree.spares.iter().filter(|s| !spare_named(s.guid)).cloned().collect();
            let new = self.build_tree(config.clone(), BTreeMap::new());
            let guids: Vec<u64> = dropped.iter().map(|l| l.guid).collect();
            self.forget_leaves(&guids);
            self.install(new);
            (dropped, dropped_spares)
        };
        let (dropped, dropped_spares) = dropped;
        for leaf in dropped.iter().filter(|l| l.present) {
            self.blank_labels(leaf).await;
        }
        for spare in &dropped_spares {
            self.blank_spare_labels(spare).await;
        }
        true
    }

    /// Lists the `encryption` feature in the pool's config (the first key family made), so
    /// that every label names it and a build that does not know encryption refuses the pool
    /// by that name; the labels are rewritten for `config_txg`. Returns whether it was not
    /// listed yet. The feature stays listed.
    pub async fn activate_encryption(&self, config_txg: u64) -> Result<bool, PoolError> {
        let listed = self
            .change_features(config_txg, |config| {
                (!config.encryption).then(|| VdevTreeConfig { encryption: true, ..config.clone() })
            })
            .await?;
        Ok(listed.is_some())
    }

    /// A change of the config's features alone (no leaf comes or goes): `change` returns the
    /// new config, or `None` when the current one needs none. The new tree is installed under
    /// the admin lock, then every label is rewritten for `config_txg`. Returns the features
    /// the new config lists that the old did not (`None`: nothing changed). The syncs after it
    /// carry the new config in the pool directory; one racing with the labels' rewrite carries
    /// it already, so a build that does not know a feature refuses what that sync wrote.
    pub(super) async fn change_features(
        &self,
        config_txg: u64,
        change: impl FnOnce(&VdevTreeConfig) -> Option<VdevTreeConfig>,
    ) -> Result<Option<Vec<&'static str>>, PoolError> {
        let added = {
            let _one_change = self.admin.lock();
            let tree = self.tree();
            let Some(config) = change(&tree.config) else { return Ok(None) };
            let before = tree.config.features();
            let added = config.features().into_iter().filter(|f| !before.contains(f)).collect();
            self.install(self.build_tree(config, BTreeMap::new()));
            added
        };
        self.write_labels(config_txg).await?;
        Ok(Some(added))
    }

    /// Writes every present leaf's labels with the current tree and `config_txg`, in two
    /// rounds (see the module doc). At least one leaf must take them.
    pub async fn write_labels(&self, config_txg: u64) -> Result<(), PoolError> {
        let tree = self.tree();
        let present: Vec<&PoolLeaf> = tree.leaves.iter().filter(|l| l.present).collect();
        let mut took = vec![true; present.len()];
        for round in [[0usize, 2], [1, 3]] {
            let writes = present.iter().map(|pool_leaf| {
                let header = self.label_header_for(pool_leaf, &tree.config, config_txg);
                async move {
                    let Ok(bytes) = header.encode() else { return false };
                    let data = SharedBuf::copy_from(&bytes);
                    let offsets = label_offsets(pool_leaf.leaf.device().len_bytes());
                    let mut ok = true;
                    for index in round {
                        ok &= pool_leaf
                            .leaf
                            .write(offsets[index], data.clone(), IoClass::SyncWrite)
                            .await
                            .is_ok();
                    }
                    ok &= pool_leaf.leaf.flush().await.is_ok();
                    ok
                }
            });
            for (t, ok) in took.iter_mut().zip(join_all(writes).await) {
                *t &= ok;
            }
        }
        // Available spares carry the config too, so that the newest found at import lists
        // them; one that does not take it is found by an older label, which still names it.
        for spare in &tree.spares {
            let _ = self.write_spare_labels(spare, &tree.config, config_txg).await;
        }
        if !present.is_empty() && !took.iter().any(|&ok| ok) {
            let path = present[0].path.clone();
            return Err(PoolError::LabelsNotWritten { pool: self.name.clone(), path });
        }
        Ok(())
    }

    /// Zeroes the four labels of a leaf that left the pool (header and uberblock rings), so
    /// that nothing takes it for a member again. Best effort: the device may be dead.
    pub async fn blank_labels(&self, pool_leaf: &PoolLeaf) {
        let device = Arc::clone(pool_leaf.leaf.device());
        let zeros = SharedBuf::copy_from(&vec![0u8; LABEL_BYTES as usize]);
        for offset in label_offsets(device.len_bytes()) {
            let _ = device.write_at(offset, zeros.clone()).await;
        }
        let _ = device.flush().await;
    }

    /// Whether top-level vdev `top` holds every block without the leaf `except`: another leaf
    /// of a mirror is present, in service, holds every synced txg and has missed no copy of a
    /// write since ([`Leaf::copies_missed`]: a block written in place meanwhile, by a
    /// receive, may be on the leaf leaving alone); on RAID-Z, at most `parity` columns lack
    /// such a leaf (a column's leaf or the one replacing it).
    pub(super) fn has_complete_copy(
        &self,
        tree: &VdevTree,
        top: usize,
        except: Option<u64>,
    ) -> bool {
        let state = self.state.lock();
        let current = |l: &PoolLeaf| {
            state.leaf_copies.get(&l.guid).is_none_or(|&then| l.leaf.copies_missed() == then)
        };
        let holds = |guid: u64| {
            Some(guid) != except
                && tree.leaves.iter().any(|l| l.guid == guid && state.holds_all(l) && current(l))
        };
        tree.config.top[top].serves_with(holds)
    }

    /// Leaves being replaced whose replacements now hold everything: what to detach.
    pub fn replacements_done(&self) -> Vec<String> {
        let tree = self.tree();
        let state = self.state.lock();
        let complete = |guid: u64| tree.leaves.iter().any(|l| l.guid == guid && state.holds_all(l));
        state
            .replaced
            .iter()
            .filter(|&(_, &new)| complete(new))
            .map(|(old, _)| format!("{old:016x}"))
            .collect()
    }

    /// Whether the leaf with guid `guid` is being replaced.
    pub fn is_replaced(&self, guid: u64) -> bool {
        self.state.lock().replaced.contains_key(&guid)
    }

    fn fresh_guid(&self, tree: &VdevTree) -> u64 {
        let mut rng = self.env.unique_rng(&format!("pool_attach/{}", self.name));
        loop {
            let guid = rng.u64();
            if guid != 0 && guid != self.guid && tree.leaves.iter().all(|l| l.guid != guid) {
                return guid;
            }
        }
    }

    /// Builds the tree `config` describes around this pool's leaves (by guid), the `added`
    /// ones, and stand-ins for any other it names.
    pub(super) fn build_tree(
        &self,
        config: VdevTreeConfig,
        added: BTreeMap<u64, PoolLeaf>,
    ) -> VdevTree {
        self.build_tree_with(config, added, Vec::new())
    }

    /// [`Pool::build_tree`], with `new_spares` available too. An available spare of `config`
    /// is found among the tree's spares, the new ones, or its leaves (a spare going back).
    pub(super) fn build_tree_with(
        &self,
        config: VdevTreeConfig,
        mut added: BTreeMap<u64, PoolLeaf>,
        new_spares: Vec<SpareLeaf>,
    ) -> VdevTree {
        let old = self.tree();
        let spares = (config.spares.iter())
            .filter(|s| s.stands_in_for == 0)
            .map(|s| {
                let kept = old.spares.iter().chain(&new_spares).find(|o| o.guid == s.guid).cloned();
                kept.unwrap_or_else(|| {
                    let leaf = old.leaves.iter().find(|l| l.guid == s.guid && l.present);
                    SpareLeaf {
                        guid: s.guid,
                        path: leaf.map_or_else(|| s.path.clone(), |l| l.path.clone()),
                        device: leaf.map(|l| Arc::clone(l.leaf.device())),
                    }
                })
            })
            .collect();
        let mut leaves = Vec::new();
        let mut top = Vec::new();
        for (index, top_config) in config.top.iter().enumerate() {
            let mut children = Vec::new();
            for child in super::config_leaves(top_config) {
                let found = old.leaves.iter().find(|l| l.guid == child.guid).cloned();
                let mut leaf = found.or_else(|| added.remove(&child.guid)).unwrap_or_else(|| {
                    let id = VdevId(self.next_leaf_id.fetch_add(1, Ordering::Relaxed));
                    let len_bytes = old.leaves.iter().map(|l| l.leaf.device().len_bytes()).max();
                    let stand_in = MissingDevice {
                        name: child.path.clone(),
                        len_bytes: len_bytes.unwrap_or(0),
                    };
                    let leaf = Leaf::new(id, &self.env, Arc::new(stand_in), &self.tunables);
                    leaf.watch(Arc::clone(&self.events), &child.path);
                    leaf.mark_gone();
                    PoolLeaf {
                        guid: child.guid,
                        top: index,
                        path: child.path.clone(),
                        leaf,
                        present: false,
                    }
                });
                leaf.top = index;
                // A leaf replaced in place is PATH/old only while its replace is recorded: a
                // config without the replace (one a crash cut short) names it PATH again.
                if leaf.path == format!("{}/old", child.path) {
                    leaf.path.clone_from(&child.path);
                }
                children.push(Arc::clone(&leaf.leaf));
                leaves.push(leaf);
            }
            top.push(
                super::build_vdev(
                    index,
                    top_config,
                    children,
                    self.ashift,
                    &self.env,
                    &self.tunables,
                )
                .expect("a config this pool wrote describes its own leaves"),
            );
        }
        VdevTree { config, root: Root::new(top), leaves, spares }
    }

    /// Swaps `tree` in, and tells each leaf whether it is behind in its new mirror.
    pub(super) fn install(&self, tree: VdevTree) {
        let tree = Arc::new(tree);
        *self.tree.write() = Arc::clone(&tree);
        let state = self.state.lock();
        let synced = state.uberblock.txg;
        Self::mark_behind(&tree.leaves, &state, synced);
    }

    /// Drops what the pool remembers of leaves that left it; a replace whose old or new leaf
    /// left is over (a detached new leaf cancels it).
    pub(super) fn forget_leaves(&self, guids: &[u64]) {
        let mut state = self.state.lock();
        for guid in guids {
            state.leaf_txg.remove(guid);
            state.leaf_missed.remove(guid);
            state.leaf_copies.remove(guid);
            state.offline_kept.remove(guid);
        }
        state.replaced.retain(|old, new| !guids.contains(old) && !guids.contains(new));
    }

    /// Readies a leaf about to join an existing vdev (attach, replace, a spare going in): its
    /// labels with `config` for `config_txg`, then its log region, where its vdev keeps it.
    pub(super) async fn ready_joining_leaf(
        &self,
        leaf: &PoolLeaf,
        config: &VdevTreeConfig,
        config_txg: u64,
    ) -> Result<(), PoolError> {
        self.write_leaf_labels(leaf, config, config_txg).await?;
        let (start, region) = self.leaf_log_region(leaf.top);
        leaf.leaf.device().prepare_log_region(start, region).await.map_err(|source| {
            PoolError::Device { pool: self.name.clone(), path: leaf.path.clone(), cause: source }
        })
    }

    pub(super) async fn write_leaf_labels(
        &self,
        leaf: &PoolLeaf,
        config: &VdevTreeConfig,
        config_txg: u64,
    ) -> Result<(), PoolError> {
        let header = self.label_header_for(leaf, config, config_txg);
        let bytes = header
            .encode()
            .map_err(|source| PoolError::Format { pool: self.name.clone(), cause: source })?;
        let data = SharedBuf::copy_from(&bytes);
        let device_error = |source| PoolError::Device {
            pool: self.name.clone(),
            path: leaf.path.clone(),
            cause: source,
        };
        for offset in label_offsets(leaf.leaf.device().len_bytes()) {
            leaf.leaf.device().write_at(offset, data.clone()).await.map_err(device_error)?;
        }
        leaf.leaf.device().flush().await.map_err(device_error)
    }

    pub(super) fn label_header_for(
        &self,
        pool_leaf: &PoolLeaf,
        config: &VdevTreeConfig,
        config_txg: u64,
    ) -> LabelHeader {
        LabelHeader {
            ashift: self.ashift,
            pool_guid: self.guid,
            leaf_guid: pool_leaf.guid,
            top_guid: config.top[pool_leaf.top].guid,
            config_txg,
            leaf_bytes: pool_leaf.leaf.device().len_bytes(),
            pool_name: self.name.clone(),
            config: config.clone(),
        }
    }
}
