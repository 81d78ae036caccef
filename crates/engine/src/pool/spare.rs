//! Hot spares (ZFS: the config's `spares` list and `spa_spare_*` in `spa_misc.c`, the
//! `spare-N` vdev of `vdev_spare` in `vdev.c`, and `spa_vdev_attach` with a spare): leaves
//! kept ready to stand in for one that faults or degrades. The store decides when
//! (crate::txg::retire, ZED's retire agent); this module changes the tree.
//!
//! - An **available** spare is listed in the config (crates/format `label::SpareConfig`) and
//!   carries labels naming the pool (top-level guid 0), but belongs to no vdev: it gets no
//!   I/O, no uberblocks and no log region. Import finds it by its labels; one not found is
//!   shown as missing and is not used.
//! - **Activation** puts the spare beside the leaf it stands in for, as an attach does: a
//!   mirror's child, or the replacing leaf of a RAID-Z column. Its labels are written first,
//!   then the tree is swapped, and the store syncs at once and resilvers every birth onto it.
//!   The leaf stays (`pool status` shows the pair as `spare-N`, the spare INUSE), so that the
//!   spare can go back once the leaf is replaced or returns.
//! - A spare in use **goes back** when it is detached ([`Pool::detach`]): its labels are
//!   rewritten as available, not blanked. The store detaches it once the leaf it stood in for
//!   has left (replaced) or is ONLINE holding every txg, and another leaf of the column or
//!   mirror holds everything. Detaching the leaf instead, by hand, keeps the spare in its
//!   place for good (it leaves the spares list), as `zpool detach` of the original does.
//! - `pool replace` of a RAID-Z leaf a spare stands in for moves the spare into the column
//!   (the old leaf leaves, the spare holding everything) and has the new leaf replace the
//!   spare, which goes back once the new leaf holds everything: a column has at most two
//!   leaves, and redundancy never drops meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_format::{data_end_bytes, LabelHeader, SpareConfig, VdevTreeConfig, LABEL_BYTES};

use super::{LeafSpec, Pool, PoolError, PoolLeaf};
use crate::device::{BlockDevice, SharedBuf};
use crate::vdev::{Leaf, LeafState, VdevId};

/// An available hot spare of an open pool.
#[derive(Clone)]
pub struct SpareLeaf {
    pub guid: u64,
    pub path: String,
    /// `None`: not found when the pool was imported.
    pub device: Option<Arc<dyn BlockDevice>>,
}

impl std::fmt::Debug for SpareLeaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("SpareLeaf").field("guid", &self.guid).field("path", &self.path))
            .field("present", &self.device.is_some())
            .finish()
    }
}

/// A spare as `pool status` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareStatus {
    pub guid: u64,
    pub path: String,
    /// AVAIL, INUSE, or UNAVAIL (not found at import).
    pub state: &'static str,
    /// The leaf it stands in for, while in use (its path).
    pub stands_in_for: Option<String>,
}

/// Spares made ready to join the pool ([`Pool::prepare_spares`]).
#[derive(Debug)]
pub struct PreparedSpares {
    spares: Vec<SpareLeaf>,
    base: VdevTreeConfig,
    config: VdevTreeConfig,
}

/// A spare made ready to stand in for a leaf ([`Pool::prepare_activation`]).
#[derive(Debug)]
pub struct PreparedActivation {
    leaf: PoolLeaf,
    base: VdevTreeConfig,
    config: VdevTreeConfig,
    /// The leaf it stands in for (path).
    pub stands_in_for: String,
}

impl PreparedActivation {
    /// The spare's path.
    pub fn spare(&self) -> &str {
        &self.leaf.path
    }
}

impl Pool {
    /// Every hot spare, available or in use, in the config's order.
    pub fn spares(&self) -> Vec<SpareStatus> {
        let tree = self.tree();
        (tree.config.spares.iter())
            .map(|spare| {
                let stands_in_for = (spare.stands_in_for != 0).then(|| {
                    (tree.leaves.iter().find(|l| l.guid == spare.stands_in_for))
                        .map_or_else(|| format!("{:016x}", spare.stands_in_for), |l| l.path.clone())
                });
                let present =
                    tree.spares.iter().any(|s| s.guid == spare.guid && s.device.is_some());
                let state = match (&stands_in_for, present) {
                    (Some(_), _) => "INUSE",
                    (None, true) => "AVAIL",
                    (None, false) => "UNAVAIL",
                };
                let path = (tree.leaves.iter().find(|l| l.guid == spare.guid))
                    .map_or_else(|| spare.path.clone(), |l| l.path.clone());
                SpareStatus { guid: spare.guid, path, state, stands_in_for }
            })
            .collect()
    }

    /// The spare in use standing in for leaf `guid`, if one does.
    pub fn spare_for(&self, guid: u64) -> Option<u64> {
        let tree = self.tree();
        tree.config.spares.iter().find(|s| s.stands_in_for == guid).map(|s| s.guid)
    }

    /// Whether leaf `guid` is a hot spare in use.
    pub fn is_spare(&self, guid: u64) -> bool {
        self.tree().config.spares.iter().any(|s| s.guid == guid)
    }

    /// Checks `new` as hot spares (`pool create … spare`, `pool add … spare`) and writes
    /// their labels with the config that lists them, for `config_txg`. [`Pool::install_spares`]
    /// lists them.
    pub async fn prepare_spares(
        &self,
        new: Vec<LeafSpec>,
        config_txg: u64,
    ) -> Result<PreparedSpares, PoolError> {
        let (base, config, spares) = {
            let _one_change = self.admin.lock();
            let tree = self.tree();
            let mut config = tree.config.clone();
            let mut spares = Vec::new();
            for spec in new {
                let taken = tree.leaves.iter().any(|l| l.path == spec.path)
                    || config.spares.iter().any(|s| s.path == spec.path);
                if taken {
                    return Err(PoolError::AlreadyMember {
                        pool: self.name.clone(),
                        path: spec.path,
                    });
                }
                self.check_new_leaf(&spec)?;
                let guid = self.fresh_spare_guid(&tree, &config);
                config.spares.push(SpareConfig { guid, path: spec.path.clone(), stands_in_for: 0 });
                spares.push(SpareLeaf { guid, path: spec.path, device: Some(spec.device) });
            }
            if let Err(cause) = config.encode() {
                return Err(PoolError::InvalidLayout {
                    pool: self.name.clone(),
                    reason: format!(
                        "the spares do not fit in the vdev tree a label holds ({cause}); use \
                         fewer spares or shorter paths"
                    ),
                });
            }
            (tree.config.clone(), config, spares)
        };
        for (written, spare) in spares.iter().enumerate() {
            if let Err(error) = self.write_spare_labels(spare, &config, config_txg).await {
                // Labels that name a config no sync recorded would be taken for a spare.
                for done in &spares[..=written] {
                    self.blank_spare_labels(done).await;
                }
                return Err(error);
            }
        }
        Ok(PreparedSpares { spares, base, config })
    }

    /// Lists prepared spares in the tree; the caller syncs next and rewrites every label.
    pub fn install_spares(&self, prepared: PreparedSpares) -> Result<Vec<String>, PoolError> {
        let PreparedSpares { spares, base, config } = prepared;
        let _one_change = self.admin.lock();
        if self.tree().config != base {
            return Err(self.changed_meanwhile("the spares"));
        }
        let paths = spares.iter().map(|s| s.path.clone()).collect();
        let tree = self.build_tree_with(config, BTreeMap::new(), spares);
        self.install(tree);
        Ok(paths)
    }

    /// Takes the available spare called `name` out of the pool (`zpool remove`); the caller
    /// syncs, rewrites the labels and blanks the spare's ([`Pool::blank_spare_labels`]).
    pub fn remove_spare(&self, name: &str) -> Result<SpareLeaf, PoolError> {
        let _one_change = self.admin.lock();
        let tree = self.tree();
        let spare = self.find_spare(name)?;
        if spare.stands_in_for != 0 {
            let leaf = (tree.leaves.iter().find(|l| l.guid == spare.stands_in_for))
                .map_or_else(|| format!("{:016x}", spare.stands_in_for), |l| l.path.clone());
            return Err(PoolError::SpareInUse { pool: self.name.clone(), spare: spare.path, leaf });
        }
        let mut config = tree.config.clone();
        config.spares.retain(|s| s.guid != spare.guid);
        let gone = tree.spares.iter().find(|s| s.guid == spare.guid).cloned();
        let new = self.build_tree_with(config, BTreeMap::new(), Vec::new());
        self.install(new);
        Ok(gone.unwrap_or(SpareLeaf { guid: spare.guid, path: spare.path, device: None }))
    }

    /// The spare called `name`: its path, the last part of its path, or its guid.
    fn find_spare(&self, name: &str) -> Result<SpareConfig, PoolError> {
        let tree = self.tree();
        let file_name = |path: &str| path.rsplit('/').next().map(str::to_owned);
        let found = (tree.config.spares.iter()).find(|s| {
            s.path == name
                || format!("{:016x}", s.guid) == name
                || file_name(&s.path).as_deref() == Some(name)
        });
        found.cloned().ok_or_else(|| PoolError::NoSuchSpare {
            pool: self.name.clone(),
            spare: name.to_owned(),
            spares: tree
                .config
                .spares
                .iter()
                .map(|s| s.path.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// The leaves a spare should stand in for now (ZED's retire agent): FAULTED, DEGRADED or
    /// missing, of a data vdev that holds everything without them, not stood in for or being
    /// replaced already; paired with an available spare large enough, each spare once.
    pub fn leaves_to_spare(&self) -> Vec<(String, u64)> {
        let tree = self.tree();
        let logs = self.log_vdevs();
        let (skip_spares, skip_leaves, replaced) = {
            let state = self.state.lock();
            let skip = &state.retire_skip;
            (skip.spares.clone(), skip.leaves.clone(), state.replaced.clone())
        };
        let mut free: Vec<&SpareLeaf> = (tree.spares.iter())
            .filter(|s| !skip_spares.contains(&s.guid))
            .filter(|s| s.device.as_ref().is_some_and(|d| d.sector_bytes() <= 1 << self.ashift))
            .collect();
        let mut pairs = Vec::new();
        for leaf in &tree.leaves {
            let state = leaf.leaf.state();
            let ailing =
                !leaf.present || matches!(state, LeafState::Faulted(_) | LeafState::Degraded);
            let busy = self.spare_for(leaf.guid).is_some()
                || self.is_spare(leaf.guid)
                || skip_leaves.contains(&leaf.guid)
                || replaced.contains_key(&leaf.guid)
                || replaced.values().any(|&new| new == leaf.guid);
            let top = &tree.config.top[leaf.top];
            let raidz_busy = top.raidz.as_ref().is_some_and(|r| {
                let column = top.children.iter().position(|c| c.guid == leaf.guid);
                column.is_none_or(|c| r.replacing.iter().any(|(col, _)| usize::from(*col) == c))
            });
            let mirror_full = top.raidz.is_none()
                && tree.leaves.iter().filter(|l| l.top == leaf.top).count()
                    >= crate::vdev::MIRROR_CHILDREN_MAX;
            if !ailing || busy || raidz_busy || mirror_full || logs.contains(&(leaf.top as u32)) {
                continue;
            }
            if !self.has_complete_copy(&tree, leaf.top, Some(leaf.guid)) {
                continue;
            }
            let end = self.child_end(&tree, leaf.top);
            let fits = |s: &&SpareLeaf| {
                s.device.as_ref().is_some_and(|d| data_end_bytes(d.len_bytes()) >= end)
            };
            if let Some(at) = free.iter().position(fits) {
                let spare = free.remove(at);
                pairs.push((format!("{:016x}", leaf.guid), spare.guid));
            }
        }
        pairs
    }

    /// The leaves `autoreplace` looks for a new device for (guid, path): FAULTED or missing,
    /// not being replaced, not a spare, not in a RAID-Z column that has a pair already (a
    /// replace, or a spare still copying), not left alone after a failed try.
    pub fn leaves_to_autoreplace(&self) -> Vec<(u64, String)> {
        let tree = self.tree();
        let state = self.state.lock();
        let spare_done = |guid: u64| {
            tree.config.spares.iter().any(|s| s.guid == guid)
                && tree.leaves.iter().any(|x| x.guid == guid && state.holds_all(x))
        };
        let column_busy = |l: &PoolLeaf| {
            let top = &tree.config.top[l.top];
            top.raidz.as_ref().is_some_and(|r| {
                let column = top.children.iter().position(|c| c.guid == l.guid);
                column.is_none_or(|c| {
                    (r.replacing.iter())
                        .any(|(col, new)| usize::from(*col) == c && !spare_done(new.guid))
                })
            })
        };
        (tree.leaves.iter())
            .filter(|l| !l.present || matches!(l.leaf.state(), LeafState::Faulted(_)))
            .filter(|l| !state.replaced.contains_key(&l.guid))
            .filter(|l| !state.replaced.values().any(|&new| new == l.guid))
            .filter(|l| !state.retire_skip.autoreplace.contains(&l.guid))
            .filter(|l| !tree.config.spares.iter().any(|s| s.guid == l.guid))
            .filter(|l| !column_busy(l))
            .map(|l| (l.guid, l.path.clone()))
            .collect()
    }

    /// Leaves spare `spare` alone until `pool clear` or the next import: its activation
    /// failed (its device, most likely), so the next spare is tried instead.
    pub fn skip_spare(&self, spare: u64) {
        self.state.lock().retire_skip.spares.insert(spare);
    }

    /// Leaves leaf `guid` to be autoreplaced no more until `pool clear` or the next import.
    pub fn skip_autoreplace(&self, guid: u64) {
        self.state.lock().retire_skip.autoreplace.insert(guid);
    }

    /// Forgets what the retire agent was told to leave alone (`pool clear`).
    pub(super) fn clear_retire_skips(&self) {
        self.state.lock().retire_skip = Default::default();
    }

    /// Where a leaf of top-level vdev `top` must hold data up to.
    fn child_end(&self, tree: &super::VdevTree, top: usize) -> u64 {
        match &tree.config.top[top].raidz {
            Some(raidz) => raidz.child_end_bytes,
            None => self.data_areas()[top].1,
        }
    }

    /// Makes spare `spare` ready to stand in for the leaf called `leaf`: writes its labels
    /// with the tree that has it in the leaf's vdev, for `config_txg`, and prepares its log
    /// region. [`Pool::install_activation`] swaps the tree.
    pub async fn prepare_activation(
        &self,
        leaf: &str,
        spare: u64,
        config_txg: u64,
    ) -> Result<PreparedActivation, PoolError> {
        let (base, config, joining, stands_in_for) = {
            let _one_change = self.admin.lock();
            let old = self.find_leaf(leaf)?;
            let tree = self.tree();
            let available = tree.spares.iter().find(|s| s.guid == spare).cloned();
            let Some(SpareLeaf { device: Some(device), path, .. }) = available else {
                return Err(self.changed_meanwhile("the spare"));
            };
            if self.spare_for(old.guid).is_some() || self.is_spare(old.guid) {
                return Err(self.changed_meanwhile("the leaf's spare"));
            }
            if !self.has_complete_copy(&tree, old.top, Some(old.guid)) {
                return Err(PoolError::NoValidReplicas {
                    pool: self.name.clone(),
                    leaf: old.path,
                    action: "put a spare in for",
                });
            }
            let mut config = tree.config.clone();
            let top = &mut config.top[old.top];
            let joining = sluice_format::LeafConfig { guid: spare, path: path.clone() };
            match &mut top.raidz {
                Some(raidz) => {
                    let column = (top.children.iter().position(|c| c.guid == old.guid))
                        .filter(|c| !raidz.replacing.iter().any(|(col, _)| usize::from(*col) == *c))
                        .ok_or_else(|| self.changed_meanwhile("the column"))?;
                    let column = u16::try_from(column).expect("RAID-Z widths fit a u16");
                    raidz.replacing.push((column, joining));
                }
                None => {
                    top.kind = sluice_format::TopKind::Mirror;
                    top.children.push(joining);
                }
            }
            for entry in &mut config.spares {
                if entry.guid == spare {
                    entry.stands_in_for = old.guid;
                }
            }
            if config.encode().is_err() {
                return Err(PoolError::InvalidLayout {
                    pool: self.name.clone(),
                    reason: format!(
                        "with spare {path} beside {} the vdev tree would not fit in a label",
                        old.path
                    ),
                });
            }
            let id = VdevId(self.next_leaf_id.fetch_add(1, Ordering::Relaxed));
            let leaf = Leaf::new(id, &self.env, device, &self.tunables);
            leaf.watch(Arc::clone(&self.events), &path);
            let joining = PoolLeaf { guid: spare, top: old.top, path, leaf, present: true };
            (tree.config.clone(), config, joining, old.path)
        };
        self.ready_joining_leaf(&joining, &config, config_txg).await?;
        Ok(PreparedActivation { leaf: joining, base, config, stands_in_for })
    }

    /// Puts a prepared spare in its vdev; the caller holds the sync lock and syncs next, then
    /// resilvers onto it.
    pub fn install_activation(&self, prepared: PreparedActivation) -> Result<PoolLeaf, PoolError> {
        let PreparedActivation { leaf, base, config, .. } = prepared;
        let _one_change = self.admin.lock();
        let tree = self.tree();
        if tree.config != base {
            return Err(self.changed_meanwhile("the spare"));
        }
        let mut added = BTreeMap::new();
        added.insert(leaf.guid, leaf.clone());
        let new = self.build_tree_with(config, added, Vec::new());
        // It holds no txg yet: the resilver copies every birth onto it.
        self.state.lock().leaf_txg.insert(leaf.guid, 0);
        self.install(new);
        Ok(leaf)
    }

    /// Spares in use that can go back to available now: the leaf they stand in for has left
    /// the pool or is ONLINE holding every txg, and another leaf of the mirror (on RAID-Z, of
    /// the column) holds everything. Named by guid, for [`Pool::detach`].
    pub fn spares_to_return(&self) -> Vec<String> {
        let tree = self.tree();
        let state = self.state.lock();
        let holds = |guid: u64| {
            tree.leaves.iter().any(|l| {
                l.guid == guid && state.holds_all(l) && l.leaf.state() == LeafState::Online
            })
        };
        let mut back = Vec::new();
        for spare in tree.config.spares.iter().filter(|s| s.stands_in_for != 0) {
            let Some(me) = tree.leaves.iter().find(|l| l.guid == spare.guid) else { continue };
            let top = &tree.config.top[me.top];
            let leaf_gone = !tree.leaves.iter().any(|l| l.guid == spare.stands_in_for);
            let covered = match &top.raidz {
                // The column's other leaf: the one the spare replaces, or the one replacing it.
                Some(raidz) => raidz.replacing.iter().any(|(column, new)| {
                    let child = top.children[usize::from(*column)].guid;
                    (new.guid == spare.guid && holds(child))
                        || (child == spare.guid && holds(new.guid))
                }),
                None => {
                    (leaf_gone || holds(spare.stands_in_for))
                        && top.children.iter().any(|c| c.guid != spare.guid && holds(c.guid))
                }
            };
            // A spare whose replacement is still copying stays where it is.
            let replaced_by_pending = state.replaced.get(&spare.guid).is_some_and(|&n| !holds(n));
            if covered && !replaced_by_pending && (leaf_gone || holds(spare.stands_in_for)) {
                back.push(format!("{:016x}", spare.guid));
            }
        }
        back
    }

    /// `config` with the in-use spare `spare` out of its vdev and available again; the tree's
    /// spare list gets its device back from `leaf`.
    pub(super) fn return_spare(config: &mut VdevTreeConfig, spare: u64) {
        for entry in &mut config.spares {
            if entry.guid == spare {
                entry.stands_in_for = 0;
            }
        }
    }

    /// Writes an available spare's labels (top-level guid 0) with `config`.
    pub(super) async fn write_spare_labels(
        &self,
        spare: &SpareLeaf,
        config: &VdevTreeConfig,
        config_txg: u64,
    ) -> Result<(), PoolError> {
        let Some(device) = &spare.device else { return Ok(()) };
        let header = self.spare_label_header(spare, config, config_txg);
        let bytes = header
            .encode()
            .map_err(|source| PoolError::Format { pool: self.name.clone(), cause: source })?;
        // The whole label, its uberblock ring zeroed: a spare back from use keeps no
        // uberblock of that use, which an import would take for what it holds.
        let mut label = vec![0u8; LABEL_BYTES as usize];
        label[..bytes.len()].copy_from_slice(&bytes);
        let data = SharedBuf::copy_from(&label);
        let device_error = |source| PoolError::Device {
            pool: self.name.clone(),
            path: spare.path.clone(),
            cause: source,
        };
        // In two rounds, as members' labels are (attach.rs): a torn rewrite leaves a whole
        // label at each end.
        let offsets = sluice_format::label_offsets(device.len_bytes());
        for round in [[0usize, 2], [1, 3]] {
            for index in round {
                device.write_at(offsets[index], data.clone()).await.map_err(device_error)?;
            }
            device.flush().await.map_err(device_error)?;
        }
        Ok(())
    }

    pub(super) fn spare_label_header(
        &self,
        spare: &SpareLeaf,
        config: &VdevTreeConfig,
        config_txg: u64,
    ) -> LabelHeader {
        LabelHeader {
            ashift: self.ashift,
            pool_guid: self.guid,
            leaf_guid: spare.guid,
            top_guid: 0,
            config_txg,
            leaf_bytes: spare.device.as_ref().map_or(0, |d| d.len_bytes()),
            pool_name: self.name.clone(),
            config: config.clone(),
        }
    }

    /// Zeroes a removed spare's labels. Best effort.
    pub async fn blank_spare_labels(&self, spare: &SpareLeaf) {
        let Some(device) = &spare.device else { return };
        let zeros = SharedBuf::copy_from(&vec![0u8; LABEL_BYTES as usize]);
        for offset in sluice_format::label_offsets(device.len_bytes()) {
            let _ = device.write_at(offset, zeros.clone()).await;
        }
        let _ = device.flush().await;
    }

    fn fresh_spare_guid(&self, tree: &super::VdevTree, config: &VdevTreeConfig) -> u64 {
        let mut rng = self.env.unique_rng(&format!("pool_spare/{}", self.name));
        loop {
            let guid = rng.u64();
            let used = guid == 0
                || guid == self.guid
                || tree.leaves.iter().any(|l| l.guid == guid)
                || config.spares.iter().any(|s| s.guid == guid);
            if !used {
                return guid;
            }
        }
    }

    fn changed_meanwhile(&self, what: &str) -> PoolError {
        PoolError::InvalidLayout {
            pool: self.name.clone(),
            reason: format!("the pool's leaves changed while {what} was being prepared; try again"),
        }
    }
}
