//! The syncer and the write throttle (ZFS: `txg_sync_thread`, `dmu_tx_delay`): syncs on the
//! timer, on dirty data and when the intent log fills its region; writers delayed smoothly,
//! counted, and only on the volume that fills the dirty data; commits that fall back to a txg
//! sync together share one.

use crate::common;

use sluice_engine::device::sim::CrashPolicy;
use sluice_engine::device::SimProfile;
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_sim::Sim;
use std::sync::Arc;
use std::time::Duration;

const LEAF_BYTES: u64 = 64 << 20;

/// The syncer makes acknowledged writes durable within txg.timeout without any explicit sync,
/// and a writer streaming far more than txg.dirty_max is held back by early syncs and delays:
/// dirty data never runs far past the maximum, and the writer always finishes.
#[test]
fn syncer_and_write_throttle() {
    let sim = Sim::new(88);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let tunables = Tunables::with([("txg.timeout_ms", "1000"), ("txg.dirty_max", "1M")]).unwrap();
    let crash_legs = legs.clone();
    let (syncs_streaming, dirty_peak, elapsed) = sim
        .run(async move {
            let spec = PoolSpec {
                name: "tank".into(),
                ashift: 12,
                top: vec![TopSpec::Mirror(specs.clone())],
            };
            let pool = Pool::create(&env, spec, &tunables).await.unwrap();
            let store = Arc::new(Store::create(pool, &tunables));
            store.create_volume("v", 16 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            store.run_syncer();
            store.write("v", 0, &[0x11; 4096]).await.unwrap();
            env.sleep(Duration::from_millis(1500)).await;
            assert!(store.syncs() >= 2, "the timer synced the write");
            let before = store.syncs();
            let start = env.now();
            let mut dirty_peak = 0;
            for chunk in 0..128u64 {
                store.write("v", (1 << 20) + chunk * (64 << 10), &[0x22; 64 << 10]).await.unwrap();
                dirty_peak = dirty_peak.max(store.dirty_bytes());
            }
            let elapsed = env.now().since(start);
            let streaming = store.syncs() - before;
            // The throttle says what it did: with the syncer running, delays, not waits.
            let throttle = store.throttle_stats();
            assert!(throttle.delayed.get() > 0, "no write was delayed");
            assert!(throttle.delayed_nanos.get() > 0);
            assert_eq!(throttle.waited_for_sync.get(), 0, "the syncer kept up");
            drop(store);
            // Cut power, dropping every unflushed write; the timer-synced write must survive.
            for leg in &crash_legs {
                leg.crash(CrashPolicy::DropAll);
            }
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let store = Store::open(pool, &tunables).await.unwrap();
            assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![0x11; 4096]);
            (streaming, dirty_peak, elapsed)
        })
        .unwrap()
        .0;
    assert!(
        syncs_streaming >= 4,
        "8 MiB through a 1 MiB dirty limit took only {syncs_streaming} syncs"
    );
    assert!(dirty_peak <= (1 << 20) + (64 << 10), "dirty data reached {dirty_peak}");
    assert!(elapsed > Duration::ZERO);
}

/// A log filling its region starts a sync: with dirty data far under a quarter of
/// `txg.dirty_max` and the timer an hour away, sync writes whose log blocks (live or waiting
/// out their deferral) pass three quarters of a vdev's log region make the syncer run, so the
/// synced txgs free the log blocks and the log stays inside its region (where a file leaf's
/// space is already written) instead of spilling into data space; once per synced txg, so
/// the log does not sync the pool at every block.
#[test]
fn a_log_filling_its_region_starts_a_sync() {
    let sim = Sim::new(89);
    // A 15 MiB log region: smaller ones never ask for a sync.
    let legs = common::legs(&sim, 2, SimProfile::ssd(), 128 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let tunables =
        Tunables::with([("txg.timeout_ms", "3600000"), ("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let spec = PoolSpec { name: "tank".into(), ashift: 12, top: vec![TopSpec::Mirror(specs)] };
        let pool = Pool::create(&env, spec, &tunables).await.unwrap();
        let store = Arc::new(Store::create(pool, &tunables));
        store.create_volume("v", 16 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        let before = store.syncs();
        let mut rng = Rng::new(5);
        let mut expected = vec![0u8; 16 << 20];
        // 4,000 logged 4 KiB writes take at least 8 KiB of log each: about 32 MiB of log
        // blocks through a region of 15 MiB.
        for i in 0..4000u64 {
            let at = (rng.u64() % 4096) * 4096;
            let byte = (i % 251) as u8 + 1;
            store.write("v", at, &[byte; 4096]).await.unwrap();
            store.flush("v").await.unwrap();
            expected[at as usize..at as usize + 4096].fill(byte);
        }
        // At most 32 MiB was ever dirty, an eighth of the quarter of 1 GiB that starts a sync.
        let syncs = store.syncs() - before;
        assert!(syncs >= 2, "the log's region filled without a sync ({syncs} syncs)");
        assert!(syncs <= 40, "{syncs} syncs for 4,000 writes: the log asked at every block");
        assert_eq!(store.read("v", 0, 16 << 20).await.unwrap(), expected);
    })
    .unwrap();
}

/// Commits that fall back to a txg sync together (here: before any sync has anchored the new
/// volume's chain) share one: a commit whose turn comes after a sync wrote its txg returns.
/// Each synced in turn before, so the last writer of a failed chain waited for all the others.
#[test]
fn commits_falling_back_together_share_a_sync() {
    let sim = Sim::new(93);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &Tunables::default()).await);
        store.create_volume("v", 4 << 20, 16384).unwrap();
        let before = store.syncs();
        let writers = (0..8u64).map(|w| {
            let store = store.clone();
            async move {
                store.write("v", w * 65536, &[w as u8 + 1; 4096]).await.unwrap();
                store.flush("v").await.unwrap();
            }
        });
        futures::future::join_all(writers).await;
        let via_txg = store.log_stats().commits_via_txg.get();
        let syncs = store.syncs() - before;
        assert!(via_txg >= 2, "{via_txg} commits fell back: the test did not gather them");
        assert!(syncs < via_txg, "{syncs} syncs for {via_txg} commits through a txg sync");
        for w in 0..8u64 {
            assert_eq!(store.read("v", w * 65536, 4096).await.unwrap(), vec![w as u8 + 1; 4096]);
        }
    })
    .unwrap();
}

/// Without a syncer to wake, a writer past `txg.dirty_max` waits for a sync it runs itself;
/// the throttle counts those waits and the delays before them, with their time.
#[test]
fn throttle_counts_delays_and_waits() {
    let sim = Sim::new(89);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::with([("txg.dirty_max", "1M")]).unwrap();
        let store = common::mirror_store(&env, specs, &t).await;
        store.create_volume("v", 16 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        for chunk in 0..64u64 {
            store.write("v", chunk * (64 << 10), &[0x33; 64 << 10]).await.unwrap();
        }
        let throttle = store.throttle_stats();
        // 4 MiB through a 1 MiB budget: every fill past 60% is delayed, every fill to the top
        // waits for a sync.
        assert!(throttle.delayed.get() > 0, "no write was delayed");
        assert!(throttle.waited_for_sync.get() >= 3, "{} waits", throttle.waited_for_sync.get());
        assert!(throttle.waited_nanos.get() > 0 && throttle.delayed_nanos.get() > 0);
        assert!(store.syncs() >= 3);
    })
    .unwrap();
}

/// The delay and the stop at the maximum fall on the volume filling the dirty-data budget, not
/// on another volume's small writes, which may use a bounded reserve past the maximum.
#[test]
fn throttle_delays_the_volume_that_fills_it() {
    let sim = Sim::new(90);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::with([("txg.dirty_max", "1M")]).unwrap();
        let store = common::mirror_store(&env, specs, &t).await;
        store.create_volume("bulk", 8 << 20, 16384).unwrap();
        store.create_volume("db", 8 << 20, 4096).unwrap();
        store.sync().await.unwrap();
        // 640 KiB dirty: past the delay threshold (60% of 1 MiB), below the maximum.
        for chunk in 0..10u64 {
            store.write("bulk", chunk * (64 << 10), &[1; 64 << 10]).await.unwrap();
        }
        let throttle = store.throttle_stats();
        let (delayed, spared) = (throttle.delayed.get(), throttle.spared.get());
        let before = env.now();
        store.write("db", 0, &[2; 4096]).await.unwrap();
        assert_eq!(env.now(), before, "the small writer was delayed");
        assert_eq!((throttle.delayed.get(), throttle.spared.get()), (delayed, spared + 1));
        store.write("bulk", 10 << 16, &[1; 64 << 10]).await.unwrap();
        assert!(env.now() > before, "the bulk writer was not delayed");
        assert_eq!(throttle.delayed.get(), delayed + 1);
        // At the maximum the bulk writer would wait for a sync; the small one goes on into a
        // reserve of an eighth of the maximum, and waits only past it.
        for chunk in 11..16u64 {
            store.write("bulk", chunk * (64 << 10), &[1; 64 << 10]).await.unwrap();
        }
        let syncs = store.syncs();
        assert!(store.dirty_bytes() >= 1 << 20, "{} dirty", store.dirty_bytes());
        let spared = throttle.spared.get();
        for chunk in 0..2u64 {
            store.write("db", 65536 + chunk * (64 << 10), &[2; 64 << 10]).await.unwrap();
        }
        assert_eq!(store.syncs(), syncs, "the small writer waited for a sync");
        assert_eq!(throttle.spared.get(), spared + 2);
        // 1 MiB from bulk, 4 KiB and 128 KiB from db: the reserve is used up.
        assert_eq!(store.dirty_bytes(), (1 << 20) + (132 << 10));
        let waited = throttle.waited_for_sync.get();
        store.write("db", 4096, &[2; 4096]).await.unwrap();
        assert_eq!(throttle.waited_for_sync.get(), waited + 1);
        assert_eq!(store.syncs(), syncs + 1);
    })
    .unwrap();
}

/// Delayed writes wake a delay apart (`txg.delay_spacing=pool`, ZFS's `dp_last_wakeup`), so
/// eight writers together take eight delays where one takes one, and the delay curve sets the
/// pool's write rate however many write. Each sleeping its delay alone (`writer`, the
/// before), eight writers took about one delay: eight times the rate the curve set, and the
/// open txg ran on past the curve into the free space's wall.
#[test]
fn delayed_writers_wake_a_delay_apart() {
    // (a lone write's delay, eight writes' together), under `spacing`.
    let run = |spacing: &'static str| {
        let sim = Sim::new(91);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        sim.run(async move {
            let t =
                Tunables::with([("txg.dirty_max", "1M"), ("txg.delay_spacing", spacing)]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs, &t).await);
            store.create_volume("v", 16 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            // 768 KiB dirty: past the delay threshold (60% of 1 MiB), well below the maximum.
            for chunk in 0..12u64 {
                store.write("v", chunk * (64 << 10), &[1; 64 << 10]).await.unwrap();
            }
            let (syncs, delayed) = (store.syncs(), store.throttle_stats().delayed.get());
            let start = env.now();
            store.write("v", 4 << 20, &[2; 4096]).await.unwrap();
            let lone = env.now().since(start);
            let start = env.now();
            let writers = (0..8u64).map(|w| {
                let store = store.clone();
                async move { store.write("v", (5 << 20) + w * 16384, &[3; 4096]).await.unwrap() }
            });
            futures::future::join_all(writers).await;
            let together = env.now().since(start);
            assert_eq!(store.syncs(), syncs, "a sync ran: the writes were not all delayed");
            assert_eq!(store.throttle_stats().delayed.get(), delayed + 1 + 8);
            (lone, together)
        })
        .unwrap()
        .0
    };
    let (lone, together) = run("pool");
    assert!(lone > Duration::ZERO, "the lone write was not delayed");
    assert!(together >= lone * 8, "8 writers took {together:?}, one {lone:?}");
    let (lone, together) = run("writer");
    assert!(together < lone * 2, "8 writers alone took {together:?}, one {lone:?}");
}

/// A large write the throttle holds near the room's maximum goes on when the txg it fills
/// quiesces for its sync, not at its delay's end: the open txg is empty then, and a stream's
/// writers that slept out up to 100 ms after it had opened left the disk idle once the sync
/// before them was written.
#[test]
fn a_delayed_large_write_wakes_when_its_txg_quiesces() {
    let sim = Sim::new(94);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        // The free space, not `txg.dirty_max`, bounds the open txg; no syncer runs, so only
        // the sync started below quiesces it.
        let t = Tunables::with([("txg.dirty_max", "1G")]).unwrap();
        let store = Arc::new(common::mirror_store(&env, specs, &t).await);
        store.create_volume("v", 32 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let chunk = 256u64 << 10;
        let mut at = 0;
        // Large writes until one is delayed 10 ms or more: near the maximum of their room.
        let last_delay = loop {
            assert!(at + chunk <= 32 << 20, "no write was delayed 10 ms");
            let start = env.now();
            store.write("v", at, &[0x44; 256 << 10]).await.unwrap();
            at += chunk;
            let took = env.now().since(start);
            if took >= Duration::from_millis(10) {
                break took;
            }
        };
        let throttle = store.throttle_stats();
        let (delayed, woken) = (throttle.delayed.get(), throttle.woken_by_sync.get());
        // The next write's delay is at least the last one's; a sync started 1 ms into it
        // quiesces its txg.
        let writer = {
            let (store, env) = (store.clone(), env.clone());
            async move {
                let start = env.now();
                store.write("v", at, &[0x55; 256 << 10]).await.unwrap();
                env.now().since(start)
            }
        };
        let syncer = {
            let (store, env) = (store.clone(), env.clone());
            async move {
                env.sleep(Duration::from_millis(1)).await;
                store.sync().await.unwrap();
            }
        };
        let (took, ()) = futures::join!(writer, syncer);
        assert_eq!(throttle.delayed.get(), delayed + 1, "the write was not delayed");
        assert_eq!(throttle.woken_by_sync.get(), woken + 1, "the quiesce did not wake it");
        assert!(took < last_delay, "the write took {took:?}, the one before {last_delay:?}");
        assert_eq!(store.read("v", at, 4096).await.unwrap(), vec![0x55; 4096]);
    })
    .unwrap();
}
