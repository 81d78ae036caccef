//! Removing a separate log device (ZFS: `spa_vdev_remove_log` in `vdev_removal.c`). A log
//! device holds only intent-log blocks, and those are needed only until the txg their records
//! belong to syncs, so nothing is copied off it: the store stops placing log blocks there,
//! moves every volume's chain to a new one elsewhere, and syncs until the device holds no live
//! log block (crate::txg::spa_vdev). Then, under the sync lock, the vdev becomes a hole (a
//! [`TopKind::Hole`] that keeps its index, since block pointers name vdevs by index) and the
//! store syncs at once, so the txg that first lists the hole in its directory is the one the
//! rewritten labels name. The removed leaves' labels are blanked last; a crash before then
//! leaves labels the directory does not name, which import drops (`Pool::adopt_config`).
//! Removing a data vdev, whose blocks would have to be copied and remapped, is not built.

use std::collections::BTreeMap;

use sluice_format::{TopConfig, TopKind};

use super::{Pool, PoolError, PoolLeaf};

impl Pool {
    /// The top-level vdev index of the log device `name` names: a lone log leaf by its path,
    /// file name or guid, or a log mirror as status and iostat name it (`mirror-N`,
    /// `log-mirror-N`, `log-N`). Anything else is refused with what to do instead.
    pub fn find_log_device(&self, name: &str) -> Result<u32, PoolError> {
        let tree = self.tree();
        let refuse = |reason: String| PoolError::CannotRemove {
            pool: self.name.clone(),
            device: name.to_owned(),
            reason,
        };
        let by_name = (tree.config.top.iter().enumerate()).find(|(index, top)| {
            let names = match top.kind {
                TopKind::Mirror => vec![format!("mirror-{index}"), format!("log-mirror-{index}")],
                TopKind::Leaf => vec![format!("log-{index}"), format!("disk-{index}")],
                TopKind::Raidz | TopKind::Hole => Vec::new(),
            };
            names.iter().any(|n| n == name)
        });
        let (index, top) = match by_name {
            Some(found) => found,
            None => {
                let leaf = self.find_leaf(name)?;
                let top = &tree.config.top[leaf.top];
                if top.log && top.kind == TopKind::Mirror {
                    return Err(refuse(format!(
                        "it is a leaf of log mirror mirror-{}: remove mirror-{} to remove the \
                         log device, or detach this leaf to keep it with fewer copies",
                        leaf.top, leaf.top
                    )));
                }
                (leaf.top, top)
            }
        };
        if !top.log {
            return Err(refuse(String::from(
                "it holds data; only log devices and hot spares can be removed (removing a data \
                 vdev is not supported: a mirror's leaf leaves with `pool detach`, a failing \
                 disk is swapped with `pool replace`)",
            )));
        }
        Ok(index as u32)
    }

    /// Makes log device `index` a hole in the tree; the caller holds the sync lock, has made
    /// sure no live log block is on it, makes it a hole in the allocator too and syncs next.
    /// Returns the leaves that left (their labels are blanked after the sync).
    pub fn install_log_removal(&self, index: u32) -> Result<Vec<PoolLeaf>, PoolError> {
        let _one_change = self.admin.lock();
        let tree = self.tree();
        let index = index as usize;
        if !tree.config.top.get(index).is_some_and(|t| t.log) {
            return Err(PoolError::CannotRemove {
                pool: self.name.clone(),
                device: format!("top-level vdev {index}"),
                reason: String::from("it is no longer a log device of the pool"),
            });
        }
        let mut config = tree.config.clone();
        config.top[index] = TopConfig::hole();
        if let Err(cause) = config.encode() {
            // The hole and its feature's name take a few bytes more than a short-pathed log
            // leaf may have.
            return Err(PoolError::CannotRemove {
                pool: self.name.clone(),
                device: format!("top-level vdev {index}"),
                reason: format!(
                    "the vdev tree with a hole in its place would not fit in a label ({cause})"
                ),
            });
        }
        let gone: Vec<PoolLeaf> = tree.leaves.iter().filter(|l| l.top == index).cloned().collect();
        let new = self.build_tree(config, BTreeMap::new());
        let guids: Vec<u64> = gone.iter().map(|l| l.guid).collect();
        self.forget_leaves(&guids);
        self.install(new);
        Ok(gone)
    }
}
