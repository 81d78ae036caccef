//! The pool's properties (ZFS: `spa_prop_get`, `spa_prop_set` and the pool property object of
//! the MOS): the scrub interval, `autoreplace`, and when the last scrub that ran to its end
//! finished. The pool owns them; the sync writes them into the pool directory, and the import
//! takes them back (crates/format `directory::properties`).
//!
//! They take the directory's V8 layout, which older builds cannot read, so the pool only
//! starts writing them when one differs from its default, as OpenZFS activates a feature
//! when it is first used: the config then lists `pool_properties`
//! ([`Pool::activate_properties`]), and every label names it. Until then a finished scrub's
//! time is kept in memory (and in the directory's scan record, which holds the last scan of
//! either kind); whoever next activates the feature writes it too.

use sluice_format::{PoolProperties, ScanKind, ScanRecord, ScanRecordPhase, VdevTreeConfig};

use super::{Pool, PoolError};

/// The properties, and those the pool opened with.
#[derive(Debug, Default)]
pub(super) struct Properties {
    now: PoolProperties,
    /// As the pool opened (from its directory, or the defaults): a pool without the feature
    /// needs it once `now` differs.
    opened: PoolProperties,
}

impl Pool {
    /// The pool's properties now.
    pub fn properties(&self) -> PoolProperties {
        self.properties.lock().now
    }

    /// What the pool directory of a sync records: the properties once the feature is listed
    /// in `config` (the tree the directory carries), nothing before.
    pub fn properties_for_directory(&self, config: &VdevTreeConfig) -> Option<PoolProperties> {
        config.properties.then(|| self.properties())
    }

    /// Whether a property changed in a pool whose config does not list the feature yet: the
    /// feature must be listed ([`Pool::activate_properties`]) before a sync can record it.
    pub fn properties_need_feature(&self) -> bool {
        let properties = self.properties.lock();
        !self.config().properties && properties.now != properties.opened
    }

    /// Takes up the properties of the directory the pool opened, or, for a directory without
    /// them, the defaults with the end of the last scrub its scan record holds (the last scan
    /// of either kind).
    pub fn restore_properties(&self, stored: Option<PoolProperties>, scan: Option<&ScanRecord>) {
        let from_record = scan
            .filter(|s| s.kind == ScanKind::Scrub && s.phase == ScanRecordPhase::Finished)
            .map_or(0, |s| s.end_secs);
        let opened = stored
            .unwrap_or(PoolProperties { last_scrub_end_secs: from_record, ..Default::default() });
        *self.properties.lock() = Properties { now: opened, opened };
    }

    /// Changes the properties with `change`; the caller lists the feature first
    /// ([`Pool::activate_properties`]) so that the next sync records them.
    pub fn update_properties(&self, change: impl FnOnce(&mut PoolProperties)) {
        change(&mut self.properties.lock().now);
    }

    /// Records that a scrub ran to its end at `end_secs` (Unix seconds); the next sync after
    /// the feature is listed records it.
    pub fn note_scrub_finished(&self, end_secs: u64) {
        self.properties.lock().now.last_scrub_end_secs = end_secs;
    }

    /// Lists the `pool_properties` feature in the pool's config so that its directory can
    /// hold them, and rewrites every label for `config_txg` (as
    /// [`Pool::activate_encryption`]). Returns whether it was not listed yet. The feature
    /// stays listed.
    pub async fn activate_properties(&self, config_txg: u64) -> Result<bool, PoolError> {
        let listed = self
            .change_features(config_txg, |config| {
                (!config.properties).then(|| VdevTreeConfig { properties: true, ..config.clone() })
            })
            .await?;
        Ok(listed.is_some())
    }
}
