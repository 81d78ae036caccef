//! Scheduled snapshots and scrubs on the simulator's clock (crate::txg::schedule): a schedule
//! of minutely and hourly rules takes a snapshot each minute and keeps what its retention
//! says, never touching a snapshot a person took; after downtime one snapshot is taken, not
//! one per missed minute; a scrub starts once the pool's interval has passed; and the
//! schedule, the snapshots' marks, the interval and the last scrub's end all survive an
//! export and import. A pool that never had a property keeps its older format until one is
//! set.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{Pool, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{ScanFunc, ScanPhase, Store};
use sluice_engine::{auto_name, SCHEDULE_CHECK_INTERVAL};
use sluice_format::{SchedulePeriod, ScheduleRule};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 1 << 20;
const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 4096;

fn setup(seed: u64) -> (Sim, Vec<SimDevice>, Arc<Store>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let tunables = Tunables::default();
    let store =
        common::store_with_volume(&sim, &legs, TopSpec::Mirror, &tunables, &data, BLOCK, |_| {});
    (sim, legs, store)
}

fn reimport(sim: &Sim, legs: &[SimDevice], store: Arc<Store>) -> Arc<Store> {
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    let env = sim.env();
    let specs = common::leaf_specs(legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        Arc::new(Store::open(pool, &tunables).await.unwrap())
    })
    .unwrap()
    .0
}

/// Lets simulated time pass while the store serves.
fn pass(sim: &Sim, duration: Duration) {
    let env = sim.env();
    sim.run(async move { env.sleep(duration).await }).unwrap();
}

/// The volume's snapshots: (name, automatic), oldest first.
fn snapshots(store: &Store) -> Vec<(String, bool)> {
    store.snapshots("v").unwrap().into_iter().map(|s| (s.name, s.automatic)).collect()
}

fn automatic(store: &Store) -> Vec<String> {
    snapshots(store).into_iter().filter(|(_, auto)| *auto).map(|(name, _)| name).collect()
}

fn now_secs(sim: &Sim) -> u64 {
    sim.env().unix_nanos() / 1_000_000_000
}

/// What `minutely:3,hourly:2` keeps when a snapshot was taken every minute up to `newest`:
/// the newest three minutes' and the first of this hour and of the hour before.
fn expected_minutely_hourly(newest: u64) -> Vec<String> {
    let minute = newest / 60 * 60;
    let hour = newest / 3_600 * 3_600;
    let mut names: Vec<String> = [minute, minute - 60, minute - 120, hour, hour - 3_600]
        .into_iter()
        .map(auto_name)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_snapshot_schedule_takes_and_prunes_as_its_retention_says() {
    let (sim, legs, store) = setup(71);
    // A pool without properties writes the older directory and labels until one is set.
    assert!(!store.pool().config().properties);
    let s = Arc::clone(&store);
    let rules = vec![
        ScheduleRule { period: SchedulePeriod::Minutely, keep: 3 },
        ScheduleRule { period: SchedulePeriod::Hourly, keep: 2 },
    ];
    let set = rules.clone();
    sim.run(async move {
        s.set_snapshot_schedule("v", set).await.unwrap();
        // A person's snapshot, which the schedule must never prune.
        s.create_snapshots(&[("v".into(), "mine".into())], 0).await.unwrap();
    })
    .unwrap();
    assert!(store.pool().config().properties, "setting a schedule lists the feature");
    store.start_schedules();
    // Two hours and ten minutes: one snapshot a minute, pruned down as the checks go.
    pass(&sim, Duration::from_secs(130 * 60 + 30));
    let newest = now_secs(&sim);
    let auto = automatic(&store);
    assert_eq!(auto, expected_minutely_hourly(newest), "at {}", auto_name(newest));
    assert!(snapshots(&store).contains(&("mine".into(), false)), "{:?}", snapshots(&store));
    let (newest_minute, hour) = (newest / 60 * 60, newest / 3_600 * 3_600);
    assert!(newest_minute - 120 > hour, "the run is meant to end past minute 2 of an hour");

    // Across an export and import (and thirty minutes with the pool not served), the
    // schedule and the marks stay; the first check takes one snapshot, not thirty.
    let store = reimport(&sim, &legs, store);
    pass(&sim, Duration::from_secs(30 * 60));
    let entry = store.volumes().into_iter().find(|v| v.name == "v").unwrap();
    assert_eq!(entry.snapshot_schedule, rules);
    assert_eq!(automatic(&store), auto, "nothing is taken or pruned while not served");
    let report = {
        let s = Arc::clone(&store);
        let since = now_secs(&sim);
        sim.run(async move { s.run_schedules(since).await }).unwrap().0
    };
    assert_eq!(report.taken.len(), 1, "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    let taken = now_secs(&sim);
    assert_eq!(taken / 3_600, newest / 3_600, "the downtime is meant to stay within the hour");
    // Minutely keeps the newest three minutes that have a snapshot (this one and the two
    // before the downtime), hourly the first of this hour and of the hour before.
    let minute = newest / 60 * 60;
    let hour = newest / 3_600 * 3_600;
    let mut expected: Vec<String> =
        [hour - 3_600, hour, minute - 60, minute, taken].into_iter().map(auto_name).collect();
    expected.sort();
    assert_eq!(automatic(&store), expected);

    // An empty schedule stops taking and pruning; the snapshots stay.
    let s = Arc::clone(&store);
    sim.run(async move { s.set_snapshot_schedule("v", Vec::new()).await.unwrap() }).unwrap();
    let before = automatic(&store);
    store.start_schedules();
    pass(&sim, SCHEDULE_CHECK_INTERVAL * 5);
    assert_eq!(automatic(&store), before);
    // Refused: a period twice, keep 0, an unknown volume.
    let s = Arc::clone(&store);
    let refusals = sim
        .run(async move {
            let twice = vec![
                ScheduleRule { period: SchedulePeriod::Daily, keep: 2 },
                ScheduleRule { period: SchedulePeriod::Daily, keep: 3 },
            ];
            let zero = vec![ScheduleRule { period: SchedulePeriod::Daily, keep: 0 }];
            [
                s.set_snapshot_schedule("v", twice).await.is_err(),
                s.set_snapshot_schedule("v", zero).await.is_err(),
                s.set_snapshot_schedule("nope", Vec::new()).await.is_err(),
            ]
        })
        .unwrap()
        .0;
    assert_eq!(refusals, [true, true, true]);
}

#[test]
fn a_scrub_schedule_starts_a_scrub_and_survives_a_restart() {
    let (sim, legs, store) = setup(72);
    let s = Arc::clone(&store);
    sim.run(async move { s.set_scrub_interval(10 * 60).await.unwrap() }).unwrap();
    assert_eq!(store.pool().properties().scrub_interval_secs, 600);
    assert_eq!(store.last_scrub_end_unix_secs(), None);
    let serving_since = now_secs(&sim);
    store.start_schedules();
    // Never scrubbed: due ten minutes after serving began, not before.
    pass(&sim, Duration::from_secs(8 * 60 + 30));
    assert!(store.scan_status().is_none(), "{:?}", store.scan_status());
    pass(&sim, Duration::from_secs(3 * 60));
    let scan = store.scan_status().unwrap();
    assert_eq!((scan.func, scan.phase), (ScanFunc::Scrub, ScanPhase::Finished), "{scan:?}");
    let ended = store.last_scrub_end_unix_secs().unwrap();
    assert!(ended >= serving_since + 600 && ended <= serving_since + 12 * 60, "{ended}");
    // A resilver replacing the scan record leaves the last scrub's end as it was; the
    // interval and the end survive an export and import.
    let s = Arc::clone(&store);
    let leaf = store.pool().leaves()[1].path.clone();
    sim.run(async move {
        s.offline_leaf(&leaf, true).await.unwrap();
        s.write("v", 0, &[7u8; 4096]).await.unwrap();
        s.sync().await.unwrap();
        s.online_leaf(&leaf).await.unwrap();
        s.wait_scan().await;
    })
    .unwrap();
    assert_eq!(store.scan_status().unwrap().func, ScanFunc::Resilver);
    let store = reimport(&sim, &legs, store);
    assert_eq!(store.pool().properties().scrub_interval_secs, 600);
    assert_eq!(store.last_scrub_end_unix_secs(), Some(ended));
    // The next is due ten minutes after the last ended, whenever serving began.
    store.start_schedules();
    let wait = (ended + 600).saturating_sub(now_secs(&sim));
    pass(&sim, Duration::from_secs(wait.saturating_sub(90)));
    assert_eq!(store.last_scrub_end_unix_secs(), Some(ended), "scrubbed early");
    pass(&sim, Duration::from_secs(180));
    let next = store.last_scrub_end_unix_secs().unwrap();
    assert!(next >= ended + 600, "{next} {ended}");
    // Interval 0: no more scheduled scrubs.
    let s = Arc::clone(&store);
    sim.run(async move { s.set_scrub_interval(0).await.unwrap() }).unwrap();
    pass(&sim, Duration::from_secs(30 * 60));
    assert_eq!(store.last_scrub_end_unix_secs(), Some(next));
}

/// A pool whose only scrub finished before the feature was listed still records it: the
/// next check lists the feature, and the end survives an import.
#[test]
fn a_finished_scrub_is_recorded_by_the_next_check() {
    let (sim, legs, store) = setup(73);
    let s = Arc::clone(&store);
    sim.run(async move {
        s.scrub_start().unwrap();
        s.wait_scan().await;
    })
    .unwrap();
    let ended = store.last_scrub_end_unix_secs().unwrap();
    assert!(!store.pool().config().properties);
    assert!(store.pool().properties_need_feature());
    let s = Arc::clone(&store);
    let since = now_secs(&sim);
    let report = sim.run(async move { s.run_schedules(since).await }).unwrap().0;
    assert!(report.failures.is_empty() && !report.scrub_started, "{report:?}");
    assert!(store.pool().config().properties);
    let store = reimport(&sim, &legs, store);
    assert_eq!(store.last_scrub_end_unix_secs(), Some(ended));
}
