//! Scheduled scrubs and snapshots: what OpenZFS leaves to timers outside the pool (its
//! packages' monthly `zfs-scrub` timers, and snapshot tools such as zfs-auto-snapshot and
//! sanoid). sluice keeps the schedules in the pool (pool property `scrub_interval_secs`, each
//! volume's `snapshot_schedule`: crates/format `directory::properties`), so that they move
//! with it, and a served store runs them ([`Store::start_schedules`]): a pool needs no cron
//! job, and a pool that is not served is not touched.
//!
//! - **Scrub.** Once `scrub_interval_secs` have passed since the last scrub that ran to its
//!   end (the pool property `last_scrub_end_secs`, wall clock), and no scan runs, a scrub
//!   starts. A pool never scrubbed counts from when this process began to serve it (its age
//!   is not recorded), so a pool served for the interval is scrubbed.
//! - **Snapshots.** A schedule is rules like `hourly:24`: a snapshot each hour, the newest 24
//!   hours' kept. One snapshot serves every rule: a snapshot is taken once the newest the
//!   schedule took is from an earlier period of its finest rule (so after downtime one
//!   snapshot is taken, not one per missed period), named `auto-YYYY-MM-DDTHHMM` in UTC, and
//!   marked as the schedule's. Retention keeps, for each rule, the first snapshot of each of
//!   its newest `keep` periods that have one (grandfather-father-son: the first snapshot of a
//!   day is that day's for `daily`); the schedule's other snapshots are destroyed. Snapshots
//!   a person took are never touched, and one with clones stays until they go.
//!
//! Periods are UTC: minutes (for tests and short-lived volumes), hours, days, ISO weeks from
//! Monday, calendar months. The check runs every [`CHECK_INTERVAL`] of the runtime's clock,
//! which the simulator advances at will. What cannot be done (a volume whose key is not
//! loaded, a pool out of space) is posted as a `schedule` event and tried again at the next
//! check; a snapshot the schedule took is posted as `snapshot_auto`.

use std::sync::Arc;
use std::time::Duration;

use sluice_format::{check_schedule, SchedulePeriod, ScheduleRule};

use super::{ScanPhase, Store, StoreError};
use crate::fm::EventClass;

/// How often the schedules are checked: a minutely rule's resolution.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// The prefix of the snapshots a schedule takes.
pub const AUTO_PREFIX: &str = "auto-";

/// What one check did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleReport {
    pub scrub_started: bool,
    /// Snapshots taken, as `VOL@NAME`.
    pub taken: Vec<String>,
    /// Snapshots pruned, as `VOL@NAME`.
    pub pruned: Vec<String>,
    /// What failed, in words (also posted as `schedule` events).
    pub failures: Vec<String>,
}

impl Store {
    /// Sets the pool's scrub interval (0: no scheduled scrubs). Lists the `pool_properties`
    /// feature first if it is not yet (every label is rewritten). Durable when this returns.
    pub async fn set_scrub_interval(&self, secs: u64) -> Result<(), StoreError> {
        self.activate_properties().await?;
        self.spa.pool().update_properties(|p| p.scrub_interval_secs = secs);
        self.sync().await?;
        Ok(())
    }

    /// Sets `volume`'s snapshot schedule (empty: none; the snapshots it took stay, and are no
    /// longer pruned). Durable when this returns.
    pub async fn set_snapshot_schedule(
        &self,
        volume: &str,
        rules: Vec<ScheduleRule>,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        check_schedule(&rules).map_err(|cause| StoreError::InvalidProperty {
            volume: volume.to_owned(),
            reason: format!("snapshot.schedule: {cause}"),
        })?;
        let dataset = self.dataset(volume)?;
        self.activate_properties().await?;
        dataset.state.lock().entry.snapshot_schedule = rules;
        self.sync().await?;
        Ok(())
    }

    /// Lists the `pool_properties` feature if it is not yet (at the next txg).
    async fn activate_properties(&self) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let pool = self.spa.pool();
        if !pool.config().properties {
            pool.activate_properties(pool.uberblock().txg + 1).await?;
        }
        Ok(())
    }

    /// Runs the schedules every [`CHECK_INTERVAL`] until the store is dropped, holding it only
    /// during a check.
    pub fn start_schedules(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let env = self.spa.pool().env().clone();
        let serving_since = env.unix_nanos() / 1_000_000_000;
        self.spa.pool().env().spawn("schedule", async move {
            loop {
                env.sleep(CHECK_INTERVAL).await;
                let Some(store) = weak.upgrade() else { return };
                if store.is_suspended() {
                    continue;
                }
                store.run_schedules(serving_since).await;
                // Also here, for a pool whose syncer is not running.
                store.retire_if_needed();
            }
        });
    }

    /// One check of the schedules (see the module doc); `serving_since` (Unix seconds) is what
    /// a pool never scrubbed counts from.
    pub async fn run_schedules(self: &Arc<Self>, serving_since: u64) -> ScheduleReport {
        let mut report = ScheduleReport::default();
        let now = self.spa.pool().env().unix_nanos() / 1_000_000_000;
        let pool = self.spa.pool();
        // A finished scrub's time, kept in memory until the feature is listed.
        if pool.properties_need_feature() {
            if let Err(error) = self.activate_properties().await {
                report.failures.push(format!("recording the pool's properties: {error}"));
            }
        }
        let properties = pool.properties();
        let since = match properties.last_scrub_end_secs {
            0 => serving_since,
            last => last,
        };
        let scanning = self.scan_status().is_some_and(|s| s.phase == ScanPhase::Scanning);
        if properties.scrub_interval_secs != 0
            && !scanning
            && now.saturating_sub(since) >= properties.scrub_interval_secs
        {
            match self.scrub_start() {
                Ok(()) => report.scrub_started = true,
                Err(error) => {
                    report.failures.push(format!("starting the scheduled scrub: {error}"))
                }
            }
        }
        for entry in self.volumes() {
            if entry.snapshot_schedule.is_empty() || super::dataset::is_hidden(&entry.name) {
                continue;
            }
            self.snapshot_on_schedule(&entry, now, &mut report).await;
        }
        for failure in &report.failures {
            pool.events().post(EventClass::Schedule, None, vec![("error", failure.clone())]);
        }
        report
    }

    /// Takes `entry`'s snapshot if one is due, then prunes what its retention no longer keeps.
    async fn snapshot_on_schedule(
        &self,
        entry: &sluice_format::VolumeEntry,
        now: u64,
        report: &mut ScheduleReport,
    ) {
        let volume = &entry.name;
        let rules = &entry.snapshot_schedule;
        let Some(finest) = rules.iter().map(|r| r.period).min() else { return };
        let newest = entry.snapshots.iter().filter(|s| s.automatic).map(|s| s.creation_secs).max();
        let mut automatic: Vec<(u64, String)> = (entry.snapshots.iter())
            .filter(|s| s.automatic)
            .map(|s| (s.creation_secs, s.name.clone()))
            .collect();
        if newest.is_none_or(|t| period_index(finest, t) < period_index(finest, now)) {
            let name = auto_name(now);
            if entry.snapshots.iter().any(|s| s.name == name) {
                report.failures.push(format!(
                    "{volume}: a snapshot named {name} is there already (not the schedule's); \
                     the schedule takes the next one a period later"
                ));
            } else {
                let names = [(volume.clone(), name.clone())];
                match self.create_snapshots_with(&names, now, None, true).await {
                    Ok(_) => {
                        report.taken.push(format!("{volume}@{name}"));
                        automatic.push((now, name.clone()));
                        self.spa.pool().events().post(
                            EventClass::SnapshotAuto,
                            None,
                            vec![("volume", volume.clone()), ("snapshot", name)],
                        );
                    }
                    Err(error) => report
                        .failures
                        .push(format!("{volume}: taking the scheduled snapshot {name}: {error}")),
                }
            }
        }
        let keep = kept(rules, &automatic);
        for (_, name) in automatic.iter().filter(|(_, name)| !keep.contains(name)) {
            match self.destroy_snapshot(volume, name).await {
                Ok(()) => report.pruned.push(format!("{volume}@{name}")),
                // One with clones stays until they go; tried again at every check.
                Err(error) => report
                    .failures
                    .push(format!("{volume}: pruning the scheduled snapshot {name}: {error}")),
            }
        }
    }
}

/// The names of the schedule's snapshots that `rules` keep, of `automatic` (creation time,
/// name): for each rule, the first snapshot of each of its newest `keep` periods that have
/// one.
pub fn kept(rules: &[ScheduleRule], automatic: &[(u64, String)]) -> Vec<String> {
    let mut sorted: Vec<&(u64, String)> = automatic.iter().collect();
    sorted.sort();
    let mut keep = Vec::new();
    for rule in rules {
        // The first snapshot of each period, oldest period first.
        let mut firsts: Vec<&String> = Vec::new();
        let mut last = None;
        for (secs, name) in &sorted {
            let index = period_index(rule.period, *secs);
            if last != Some(index) {
                firsts.push(name);
                last = Some(index);
            }
        }
        let skip = firsts.len().saturating_sub(usize::from(rule.keep));
        keep.extend(firsts.into_iter().skip(skip).cloned());
    }
    keep.sort();
    keep.dedup();
    keep
}

/// Which period of `period` the Unix time `secs` falls in, counted from the epoch's.
pub fn period_index(period: SchedulePeriod, secs: u64) -> u64 {
    let days = secs / 86_400;
    match period {
        SchedulePeriod::Minutely => secs / 60,
        SchedulePeriod::Hourly => secs / 3_600,
        SchedulePeriod::Daily => days,
        // 1970-01-01 was a Thursday: weeks start on the Monday three days before.
        SchedulePeriod::Weekly => (days + 3) / 7,
        SchedulePeriod::Monthly => {
            let (year, month, _) = civil_from_days(days);
            year * 12 + u64::from(month) - 1
        }
    }
}

/// The name of a snapshot the schedule takes at `secs`: `auto-YYYY-MM-DDTHHMM`, UTC.
pub fn auto_name(secs: u64) -> String {
    let (year, month, day) = civil_from_days(secs / 86_400);
    let minutes = secs % 86_400 / 60;
    format!("{AUTO_PREFIX}{year:04}-{month:02}-{day:02}T{:02}{:02}", minutes / 60, minutes % 60)
}

/// The proleptic Gregorian date (year, month 1-12, day 1-31) of day `days` since
/// 1970-01-01: Howard Hinnant's `civil_from_days`, for days on or after the epoch. Written
/// here because the engine needs only this and a minute's name, not a date crate's parsing
/// and time zones.
fn civil_from_days(days: u64) -> (u64, u8, u8) {
    // Shifted so that a 400-year era starts on 0000-03-01 (the leap day ends a year).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month as u8, day as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_names_are_utc() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        // 2026-11-28T07:00:00Z.
        assert_eq!(auto_name(1_795_849_200), "auto-2026-11-28T0700");
        assert_eq!(auto_name(1_795_849_259), "auto-2026-11-28T0700");
        assert_eq!(auto_name(1_767_225_599), "auto-2025-12-31T2359");
        // Monday 2026-11-23 starts the week of Saturday 2026-11-28; Sunday 11-22 ends the
        // week before.
        let day = |d: u64| 1_795_824_000 + d * 86_400 - 28 * 86_400;
        let week = |d| period_index(SchedulePeriod::Weekly, day(d));
        assert_eq!(week(23), week(28));
        assert_eq!(week(22) + 1, week(23));
        assert_eq!(week(29), week(23));
        assert_eq!(
            period_index(SchedulePeriod::Monthly, 1_767_225_599) + 1,
            period_index(SchedulePeriod::Monthly, 1_767_225_600)
        );
    }

    /// hourly:3 and daily:2 over two days of hourly snapshots: the newest three hours' and
    /// the first of each of the last two days.
    #[test]
    fn retention_keeps_the_first_of_each_newest_period() {
        let start = 1_795_824_000; // 2026-11-28T00:00Z
        let snaps: Vec<(u64, String)> =
            (0..48).map(|h| (start + h * 3_600, auto_name(start + h * 3_600))).collect();
        let rules = [
            ScheduleRule { period: SchedulePeriod::Hourly, keep: 3 },
            ScheduleRule { period: SchedulePeriod::Daily, keep: 2 },
        ];
        let keep = kept(&rules, &snaps);
        assert_eq!(
            keep,
            [
                "auto-2026-11-28T0000",
                "auto-2026-11-29T0000",
                "auto-2026-11-29T2100",
                "auto-2026-11-29T2200",
                "auto-2026-11-29T2300",
            ]
        );
        // A rule keeping more periods than there are keeps all their firsts.
        let all = kept(&[ScheduleRule { period: SchedulePeriod::Daily, keep: 30 }], &snaps);
        assert_eq!(all, ["auto-2026-11-28T0000", "auto-2026-11-29T0000"]);
        assert!(kept(&rules, &[]).is_empty());
    }
}
