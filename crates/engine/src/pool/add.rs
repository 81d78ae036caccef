//! Adding top-level vdevs to a pool while it serves (ZFS: `spa_vdev_add`): a leaf, a mirror, a
//! RAID-Z vdev, or a separate log device. The new leaves' labels are written first (with the
//! tree that has them and the txg that will first carry it) and their log regions prepared;
//! then, under the sync lock, the tree is swapped and the allocator given the new vdevs'
//! space (the store, crate::txg::spa_vdev), and the store syncs at once: that txg's directory
//! lists the new vdevs with empty space maps (all free). A crash before that sync leaves the
//! new leaves' labels ahead of the directory, and import drops them (`Pool::adopt_config`); a
//! crash after it finds them members. New vdevs hold nothing yet, so nothing is resilvered.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_format::raidz::RaidzGeometry;
use sluice_format::{data_end_bytes, LeafConfig, RaidzConfig, TopConfig, TopKind, VdevTreeConfig};

use super::{build_vdev, LeafSpec, Pool, PoolError, PoolLeaf, TopSpec, LEAF_BYTES_MIN};
use crate::vdev::{Leaf, VdevId, MIRROR_CHILDREN_MAX};

/// Vdevs made ready to join the pool ([`Pool::prepare_add`]).
#[derive(Debug)]
pub struct PreparedAdd {
    leaves: Vec<PoolLeaf>,
    base: VdevTreeConfig,
    config: VdevTreeConfig,
}

impl Pool {
    /// What a device joining this pool as a new top-level vdev's leaf or a hot spare must be:
    /// at least [`LEAF_BYTES_MIN`], with sectors no larger than the pool's allocation unit.
    pub(super) fn check_new_leaf(&self, spec: &LeafSpec) -> Result<(), PoolError> {
        let len = spec.device.len_bytes();
        if len < LEAF_BYTES_MIN {
            return Err(PoolError::LeafTooSmall {
                pool: self.name.clone(),
                path: spec.path.clone(),
                len_bytes: len,
                min_bytes: LEAF_BYTES_MIN,
            });
        }
        let sector = spec.device.sector_bytes();
        if sector > 1 << self.ashift {
            return Err(PoolError::SectorTooLarge {
                pool: self.name.clone(),
                path: spec.path.clone(),
                sector,
                ashift: self.ashift,
            });
        }
        Ok(())
    }

    /// Checks `tops` as `pool create` checks its vdevs (widths, sizes, sectors no larger than
    /// the pool's allocation unit, paths not members), writes the new leaves' labels for
    /// `config_txg` and prepares their log regions. [`Pool::install_add`] puts them in.
    pub async fn prepare_add(
        &self,
        tops: Vec<TopSpec>,
        config_txg: u64,
    ) -> Result<PreparedAdd, PoolError> {
        let (base, config, leaves) = {
            let _one_change = self.admin.lock();
            let tree = self.tree();
            let layout =
                |reason: String| PoolError::InvalidLayout { pool: self.name.clone(), reason };
            let mut config = tree.config.clone();
            let mut leaves = Vec::new();
            let mut rng = self.env.unique_rng(&format!("pool_add/{}", self.name));
            let mut taken: Vec<u64> = tree.leaves.iter().map(|l| l.guid).collect();
            taken.extend(config.spares.iter().map(|s| s.guid));
            taken.extend(config.top.iter().map(|t| t.guid));
            let mut guid = || loop {
                let g = rng.u64();
                if g != 0 && g != self.guid && !taken.contains(&g) {
                    taken.push(g);
                    break g;
                }
            };
            for top in tops {
                let (kind, log, specs, parity) = match top {
                    TopSpec::Leaf(leaf) => (TopKind::Leaf, false, vec![leaf], 0),
                    TopSpec::Mirror(specs) => (TopKind::Mirror, false, specs, 0),
                    TopSpec::Raidz { parity, leaves } => (TopKind::Raidz, false, leaves, parity),
                    TopSpec::Log(inner) => match *inner {
                        TopSpec::Leaf(leaf) => (TopKind::Leaf, true, vec![leaf], 0),
                        TopSpec::Mirror(specs) => (TopKind::Mirror, true, specs, 0),
                        _ => return Err(layout("a log device is a leaf or a mirror".into())),
                    },
                    TopSpec::Spare(_) => {
                        return Err(layout("spares are added with Store::add_spares".into()))
                    }
                };
                if kind == TopKind::Mirror && !(2..=MIRROR_CHILDREN_MAX).contains(&specs.len()) {
                    return Err(layout(format!(
                        "a mirror needs 2 to {MIRROR_CHILDREN_MAX} leaves, got {}",
                        specs.len()
                    )));
                }
                for spec in &specs {
                    let member = |p: &str| p == spec.path;
                    if tree.leaves.iter().any(|l| member(&l.path))
                        || config.spares.iter().any(|s| member(&s.path))
                        || leaves.iter().any(|l: &PoolLeaf| member(&l.path))
                    {
                        return Err(PoolError::AlreadyMember {
                            pool: self.name.clone(),
                            path: spec.path.clone(),
                        });
                    }
                    self.check_new_leaf(spec)?;
                }
                let raidz = if kind == TopKind::Raidz {
                    let width = u32::try_from(specs.len()).unwrap_or(u32::MAX);
                    RaidzGeometry::new(width, u32::from(parity), u32::from(self.ashift))
                        .map_err(|error| layout(error.to_string()))?;
                    Some(RaidzConfig {
                        parity,
                        child_end_bytes: (specs.iter())
                            .map(|l| data_end_bytes(l.device.len_bytes()))
                            .min()
                            .unwrap_or(0),
                        replacing: Vec::new(),
                        log_copies: true,
                    })
                } else {
                    None
                };
                let index = config.top.len();
                let children: Vec<LeafConfig> = (specs.iter())
                    .map(|s| LeafConfig { guid: guid(), path: s.path.clone() })
                    .collect();
                for (child, spec) in children.iter().zip(specs) {
                    let id = VdevId(self.next_leaf_id.fetch_add(1, Ordering::Relaxed));
                    let leaf = Leaf::new(id, &self.env, spec.device, &self.tunables);
                    leaf.watch(Arc::clone(&self.events), &child.path);
                    leaves.push(PoolLeaf {
                        guid: child.guid,
                        top: index,
                        path: child.path.clone(),
                        leaf,
                        present: true,
                    });
                }
                config.top.push(TopConfig { kind, log, guid: guid(), children, raidz });
            }
            if config.top.iter().all(|t| t.log) {
                return Err(layout("a pool needs a data vdev besides its log devices".into()));
            }
            if let Err(cause) = config.encode() {
                return Err(layout(format!(
                    "the vdev tree would not fit in a label ({cause}); use fewer leaves or \
                     shorter paths"
                )));
            }
            (tree.config.clone(), config, leaves)
        };
        // Labels first; then each new leaf's log region, from its vdev's data area.
        for leaf in &leaves {
            self.write_leaf_labels(leaf, &config, config_txg).await?;
        }
        for (index, top) in config.top.iter().enumerate().skip(base.top.len()) {
            let members: Vec<&PoolLeaf> = leaves.iter().filter(|l| l.top == index).collect();
            let children = members.iter().map(|l| Arc::clone(&l.leaf)).collect();
            let vdev = build_vdev(index, top, children, self.ashift, &self.env, &self.tunables)
                .ok_or_else(|| PoolError::InvalidLayout {
                    pool: self.name.clone(),
                    reason: format!("top-level vdev {index} does not fit its leaves"),
                })?;
            let (start, region) = super::log_region_of(&vdev, self.ashift);
            for leaf in members {
                leaf.leaf.device().prepare_log_region(start, region).await.map_err(|source| {
                    PoolError::Device {
                        pool: self.name.clone(),
                        path: leaf.path.clone(),
                        cause: source,
                    }
                })?;
            }
        }
        Ok(PreparedAdd { leaves, base, config })
    }

    /// Puts prepared vdevs in the tree; the caller holds the sync lock, gives the allocator
    /// their space (returned: each new vdev's data area, shape and whether it holds only log
    /// blocks), and syncs next.
    #[allow(clippy::type_complexity)]
    pub fn install_add(
        &self,
        prepared: PreparedAdd,
    ) -> Result<(Vec<String>, Vec<((u64, u64), Option<RaidzGeometry>, bool)>), PoolError> {
        let PreparedAdd { leaves, base, config } = prepared;
        let _one_change = self.admin.lock();
        if self.tree().config != base {
            return Err(PoolError::InvalidLayout {
                pool: self.name.clone(),
                reason: "the pool's leaves changed while the vdevs were being prepared; try \
                         again"
                    .into(),
            });
        }
        let first = base.top.len();
        let logs: Vec<bool> = config.top.iter().skip(first).map(|t| t.log).collect();
        let paths = leaves.iter().map(|l| l.path.clone()).collect();
        let added: BTreeMap<u64, PoolLeaf> = leaves.into_iter().map(|l| (l.guid, l)).collect();
        let tree = self.build_tree(config, added.clone());
        {
            // Nothing to copy onto them: they hold every txg there is of their vdev.
            let mut state = self.state.lock();
            let synced = state.uberblock.txg;
            for guid in added.keys() {
                state.leaf_txg.insert(*guid, synced);
            }
        }
        let spaces = (tree.root.top_level().iter().skip(first).zip(logs))
            .map(|(vdev, log)| {
                let geometry = match vdev {
                    crate::vdev::Vdev::Raidz(raidz) => Some(raidz.geometry()),
                    _ => None,
                };
                (vdev.data_area(), geometry, log)
            })
            .collect();
        self.install(tree);
        Ok((paths, spaces))
    }
}
