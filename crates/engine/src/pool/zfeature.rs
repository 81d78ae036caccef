//! Format features enabled on a pool after it was made (ZFS: `zfeature.c`'s enabling, and
//! `zpool upgrade`). A pool lists the features a reader must know
//! (`sluice_format::VdevTreeConfig::features`); most are listed once the pool uses what they
//! name, but some change only how blocks are stored from then on, and a pool made by an older
//! build, or by `pool create -d` for a host that runs one, goes without them until it is
//! upgraded (`sluice_format::FEATURES_UPGRADABLE`). Enabling one is one-way: builds that do
//! not know it refuse the pool by the feature's name from then on, as OpenZFS refuses a pool
//! with an active feature it does not support. Blocks written before stay as they are, and
//! every build that knows the feature reads both kinds (each block pointer says how its
//! block is stored).

use super::{Pool, PoolError};

impl Pool {
    /// The upgradable features this pool does not list: what [`Pool::enable_features`]
    /// would enable.
    pub fn features_disabled(&self) -> Vec<&'static str> {
        self.config().features_disabled()
    }

    /// Lists every upgradable feature the pool does not list yet and rewrites every label
    /// for `config_txg`, as [`Pool::activate_properties`] does (`change_features`). Returns
    /// the features it enabled (none when the pool had them all). The sync after it writes
    /// the new config into the pool directory, and from that sync on blocks are stored as the
    /// features say.
    pub async fn enable_features(&self, config_txg: u64) -> Result<Vec<&'static str>, PoolError> {
        let enabled = self
            .change_features(config_txg, |config| {
                (!config.features_disabled().is_empty()).then(|| config.upgraded())
            })
            .await?;
        Ok(enabled.unwrap_or_default())
    }
}
