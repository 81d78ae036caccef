//! A shrink that lands between a write's range check and its insert, made to happen every time
//! with a pause point (crates/host/tests/shrink_race.rs races the same on real threads, where
//! it happens only some of the time). The write is refused as out of range, nothing is stored
//! past the new end, the audit balances, and a grow reads the tail back as zeros.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use sluice_engine::device::SimProfile;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::StoreError;
use sluice_sim::Sim;

const FULL: u64 = 4 << 20;
const SHRUNK: u64 = 3 << 20;
const BLOCK: u32 = 16384;

#[test]
fn a_shrink_between_a_writes_check_and_its_insert_refuses_the_write() {
    let sim = Sim::new(21);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    sim.run(async move {
        let store = Arc::new(
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await,
        );
        store.create_volume("v", FULL, BLOCK).unwrap();
        store.sync().await.unwrap();
        let (reached, release) = store.arm_pause("dmu.assigned");
        // A write into the part the shrink takes away, stopped after its range check.
        let write = {
            let store = Arc::clone(&store);
            async move { store.write("v", SHRUNK + 65536, &[0x5a; 262144]).await }
        };
        let shrink = async {
            reached.await.unwrap();
            store.resize_volume("v", SHRUNK).await.unwrap();
            drop(release);
        };
        let (written, ()) = futures::join!(write, shrink);
        assert!(
            matches!(written, Err(StoreError::OutOfRange { size_bytes: SHRUNK, .. })),
            "the write that the shrink overtook: {written:?}"
        );
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        store.resize_volume("v", FULL).await.unwrap();
        let tail = store.read("v", SHRUNK, FULL - SHRUNK).await.unwrap();
        assert!(tail.iter().all(|&b| b == 0), "the refused write's bytes are in the tail");
    })
    .unwrap();
}
