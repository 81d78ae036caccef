//! A panic inside the store suspends it. parking_lot's locks do not poison, so a panic caught
//! by a caller (the NBD server answers the request with EIO and goes on) used to leave the store
//! serving from whatever half-updated state the panic left. Now every later request fails
//! cleanly with `Suspended`, nothing more is written, and an import returns the pool to its last
//! synced txg with the intent log replayed: what was acknowledged is there, and the request that
//! panicked is not.

use crate::common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use sluice_engine::device::sim::CrashPolicy;
use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_engine::volume::Volume;
use sluice_engine::ErrorKind;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;

fn suspended(result: Result<impl Sized, StoreError>) -> bool {
    matches!(result, Err(e) if e.kind() == ErrorKind::Suspended)
}

/// Panics at `point` while serving; checks the store suspends and what an import finds.
fn panic_suspends_at(point: &'static str, seed: u64) {
    let sim = Sim::new(seed);
    let legs = common::legs_with(
        &sim,
        2,
        SimProfile::ssd(),
        LEAF_BYTES,
        sluice_engine::device::sim::SimOptions { store_data: true, record_log: false },
    );
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let crash_legs = legs.clone();
    sim.run(async move {
        let tunables = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &tunables).await);
        store.create_volume("v", 4 << 20, 4096).unwrap();
        store.sync().await.unwrap();
        let volume = Volume::open(&store, "v").unwrap();
        // Synced, then acknowledged through the log, then acknowledged without durability.
        volume.write(0, &[1; 4096], false).await.unwrap();
        store.sync().await.unwrap();
        volume.write(4096, &[2; 4096], true).await.unwrap();
        volume.write(8192, &[3; 4096], false).await.unwrap();
        let writes_before = legs.iter().map(|l| l.stats().writes).sum::<u64>();

        store.arm_fail_point(point);
        let caught = match point {
            "dmu.modify" => AssertUnwindSafe(volume.write(12288, &[4; 4096], false))
                .catch_unwind()
                .await
                .map(drop),
            _ => AssertUnwindSafe(store.sync()).catch_unwind().await.map(drop),
        };
        assert!(caught.is_err(), "{point}: the fail point did not panic");
        assert!(store.is_suspended(), "{point}: a panic left the store serving");
        // Every later request fails cleanly, and says why.
        assert!(suspended(volume.write(16384, &[5; 4096], false).await), "{point}: write");
        assert!(suspended(volume.write(16384, &[5; 4096], true).await), "{point}: FUA write");
        assert!(suspended(volume.read(0, 4096).await), "{point}: read");
        assert!(suspended(volume.flush().await), "{point}: flush");
        assert!(suspended(volume.zero(0, 4096, false).await), "{point}: zero");
        assert!(suspended(store.sync().await), "{point}: sync");
        assert!(suspended(store.resize_volume("v", 8 << 20).await), "{point}: resize");
        let message = volume.flush().await.unwrap_err().to_string();
        assert!(message.contains("a panic in") && message.contains("import it again"), "{message}");
        // Nothing more was written after the panic.
        let writes_after = legs.iter().map(|l| l.stats().writes).sum::<u64>();
        assert_eq!(writes_before, writes_after, "{point}: a suspended store wrote");
        drop(volume);
        drop(store);

        // Power off (unflushed writes lost) and import.
        for leg in &crash_legs {
            leg.crash(CrashPolicy::DropAll);
        }
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = Store::open(pool, &tunables).await.unwrap();
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![1; 4096], "{point}: synced");
        assert_eq!(store.read("v", 4096, 4096).await.unwrap(), vec![2; 4096], "{point}: logged");
        assert_eq!(store.read("v", 12288, 4096).await.unwrap(), vec![0; 4096], "{point}: panicked");
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

#[test]
fn a_panic_in_the_write_path_suspends_the_store() {
    panic_suspends_at("dmu.modify", 5);
}

#[test]
fn a_panic_in_a_sync_suspends_the_store() {
    panic_suspends_at("spa_sync.write_volumes", 6);
}
