//! Changing a pool's leaves while it serves: attach turns a lone leaf into a mirror (or widens
//! one), detach takes a leaf out for good, replace swaps a failing leaf for a new one; the
//! refusals zpool makes; and power cuts at points spread over a replace (the new leaf's labels,
//! the swap's sync, the label rewrite, the resilver, the old leaf's detach): after each import
//! the pool has the old or the new set of leaves, the resilver and the replace finish, and every
//! leaf of the final pool alone reads back every block.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::{Fault, SimOptions};
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolError, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_engine::vdev::{FaultReason, LeafState};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 4096;

fn tunables() -> Tunables {
    Tunables::with([("cache.bytes_max", "0"), ("scan.chunk_bytes", "1M")]).unwrap()
}

/// A store on pool "tank" made of `top` over `legs`, with one volume full of random data.
fn setup(
    sim: &Sim,
    legs: &[SimDevice],
    top: impl FnOnce(Vec<LeafSpec>) -> TopSpec,
    seed: u64,
) -> (Arc<Store>, Vec<u8>) {
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let store = common::store_with_volume(sim, legs, top, &tunables(), &data, BLOCK, |_| {});
    (store, data)
}

fn spec(device: &SimDevice) -> LeafSpec {
    LeafSpec { path: device.name().to_owned(), device: Arc::new(device.clone()) }
}

/// What serving does: resilvers what is behind, then detaches replaced leaves, until
/// nothing is left to do.
fn settle(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    sim.run(async move {
        for _ in 0..4 {
            s.resume_scan();
            s.wait_scan().await;
            s.detach_replaced().await;
        }
    })
    .unwrap();
}

fn paths(store: &Store) -> Vec<String> {
    store.pool().leaves().iter().map(|l| l.path.clone()).collect()
}

/// Each leaf of the store alone (the others lost) reads back every block.
fn each_leaf_alone(sim: &Sim, store: &Arc<Store>, devices: &[SimDevice], data: &[u8], what: &str) {
    let members = paths(store);
    let in_pool: Vec<&SimDevice> =
        devices.iter().filter(|d| members.contains(&d.name().to_owned())).collect();
    for alone in &in_pool {
        for other in in_pool.iter().filter(|d| d.name() != alone.name()) {
            other.inject(Fault::Lost);
        }
        assert_eq!(
            common::read_all(sim, store, data, BLOCK),
            (0, 0),
            "{what}: {} alone",
            alone.name()
        );
        for other in &in_pool {
            other.clear_faults();
        }
        let s = Arc::clone(store);
        sim.run(async move { s.clear_leaves(None).await.unwrap() }).unwrap();
        settle(sim, store);
    }
}

fn export_import(sim: &Sim, store: Arc<Store>, devices: &[SimDevice]) -> Arc<Store> {
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    let env = sim.env();
    let specs = common::leaf_specs(devices);
    sim.run(async move {
        let pool = Pool::import(&env, specs, "tank", &tunables()).await.unwrap();
        Arc::new(Store::open(pool, &tunables()).await.unwrap())
    })
    .unwrap()
    .0
}

/// A lone leaf becomes a mirror by attach, while writes go on; the new leg is resilvered in
/// the background and then alone holds everything; the mirror survives export and import.
/// Then detach takes the old leg out for good: its labels are blank, and the pool imports
/// without it as a lone leaf again.
#[test]
fn attach_makes_a_mirror_and_detach_undoes_it() {
    let sim = Sim::new(1);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &legs[..1], |mut l| TopSpec::Leaf(l.remove(0)), 1);
    let s = Arc::clone(&store);
    let new = spec(&legs[1]);
    let path = sim.run(async move { s.attach_leaf("leg0", new).await.unwrap() }).unwrap().0;
    assert_eq!(path, "leg1");
    assert_eq!(store.pool().config().top[0].children.len(), 2);
    common::overwrite(&sim, &store, &mut data, 6, 0x21);
    settle(&sim, &store);
    assert!(store.pool().leaves_behind().is_empty());
    each_leaf_alone(&sim, &store, &legs, &data, "after attach");

    let store = export_import(&sim, store, &legs);
    assert_eq!(paths(&store), ["leg0", "leg1"]);
    assert!(store.pool().leaves_behind().is_empty(), "the resilvered leg holds every txg");

    // Detach leg0: leg1 is left, a lone leaf with the same top-level guid.
    let top_guid = store.pool().config().top[0].guid;
    let s = Arc::clone(&store);
    sim.run(async move { s.detach_leaf("leg0").await.unwrap() }).unwrap();
    let refused = {
        let s = Arc::clone(&store);
        sim.run(async move { s.detach_leaf("leg1").await.unwrap_err() }).unwrap().0
    };
    assert!(matches!(refused, StoreError::Pool(PoolError::NotMirror { .. })), "{refused}");
    assert!(refused.to_string().contains("replace"), "{refused}");
    common::overwrite(&sim, &store, &mut data, 2, 0x31);
    let store = export_import(&sim, store, &legs);
    assert_eq!(paths(&store), ["leg1"]);
    assert_eq!(store.pool().config().top[0].guid, top_guid);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    // The detached leg is no pool's leaf any more.
    let env = sim.env();
    let alone = common::leaf_specs(&legs[..1]);
    let found = sim.run(async move { Pool::import(&env, alone, "tank", &tunables()).await.err() });
    assert!(matches!(found.unwrap().0, Some(PoolError::NotFound { .. })));
}

/// zpool's refusals: a leaf too small, one already in the pool, a detach that would leave no
/// copy of everything (the other leg is behind).
#[test]
fn attach_and_detach_refusals() {
    let sim = Sim::new(2);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &legs, TopSpec::Mirror, 2);
    let small = SimDevice::new(
        &sim.env(),
        "small",
        SimProfile::ssd(),
        LEG_BYTES / 2,
        SimOptions::default(),
    );
    let s = Arc::clone(&store);
    let (too_small, member) = sim
        .run(async move {
            let too_small = s.attach_leaf("leg0", spec(&small)).await.unwrap_err();
            let again = LeafSpec { path: "leg1".into(), device: Arc::new(small.clone()) };
            (too_small, s.attach_leaf("leg0", again).await.unwrap_err())
        })
        .unwrap()
        .0;
    assert!(matches!(too_small, StoreError::Pool(PoolError::LeafTooSmall { .. })), "{too_small}");
    assert!(matches!(member, StoreError::Pool(PoolError::AlreadyMember { .. })), "{member}");
    assert_eq!(paths(&store), ["leg0", "leg1"], "a refused attach changes nothing");

    // Leg1 behind (it was offline while the pool wrote): leg0 is the only complete copy.
    let s = Arc::clone(&store);
    sim.run(async move { s.offline_leaf("leg1", true).await.unwrap() }).unwrap();
    common::overwrite(&sim, &store, &mut data, 3, 0x41);
    store.pool().online("leg1").unwrap();
    let s = Arc::clone(&store);
    let refused = sim.run(async move { s.detach_leaf("leg0").await.unwrap_err() }).unwrap().0;
    assert!(matches!(refused, StoreError::Pool(PoolError::NoValidReplicas { .. })), "{refused}");
    // Detaching the leg that is behind is fine.
    let s = Arc::clone(&store);
    sim.run(async move { s.detach_leaf("leg1").await.unwrap() }).unwrap();
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// An attach that makes a lone leaf a mirror's first child has the sync that installs the
/// mirror flush that leaf alone: blocks the intent log or a receive wrote in place before the
/// attach went to it alone, unflushed, and a mirror's flush succeeds on any one child's word,
/// so the new child's flush would have covered a failed one of the leaf that holds them. With
/// the leaf's flushes failing, the attach's sync fails and suspends the store (as the next
/// sync of the lone leaf would have), naming the leaf; before, the attach succeeded.
#[test]
fn an_attach_flushes_the_lone_leaf_alone() {
    let sim = Sim::new(7);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let (store, _) = setup(&sim, &legs[..1], |mut l| TopSpec::Leaf(l.remove(0)), 7);
    let s = Arc::clone(&store);
    sim.run(async move { s.write("v", 0, &[9; 16 << 10]).await.unwrap() }).unwrap();
    legs[0].inject(Fault::FlushError);
    let s = Arc::clone(&store);
    let new = spec(&legs[1]);
    let failed = sim.run(async move { s.attach_leaf("leg0", new).await.unwrap_err() }).unwrap().0;
    assert!(failed.to_string().contains("leg0"), "{failed}");
    assert!(store.is_suspended(), "the failed flush of the lone leaf suspends the store");
}

/// A leg that fails every write is faulted; `replace` puts a new device in its place while
/// writes go on: the new leg is resilvered, the faulted one detached, and the new one alone
/// holds everything.
#[test]
fn replace_a_faulted_leg_under_writes() {
    let sim = Sim::new(3);
    let legs = common::legs(&sim, 3, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &legs[..2], TopSpec::Mirror, 3);
    legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 6, 0x51);
    assert_eq!(
        store.pool().leaves()[1].leaf.state(),
        LeafState::Faulted(FaultReason::TooManyErrors)
    );
    let s = Arc::clone(&store);
    let new = spec(&legs[2]);
    sim.run(async move { s.replace_leaf("leg1", new).await.unwrap() }).unwrap();
    assert!(store.pool().is_replaced(store.pool().find_leaf("leg1").unwrap().guid));
    common::overwrite(&sim, &store, &mut data, 4, 0x61);
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg2"], "the faulted leg was detached");
    legs[1].clear_faults();
    each_leaf_alone(&sim, &store, &legs, &data, "after replace");
    let store = export_import(&sim, store, &legs);
    assert_eq!(paths(&store), ["leg0", "leg2"]);
}

/// Power cuts at points spread over a replace of a working leg under a sync loop (labels,
/// the swap's sync, the label rewrite, the resilver's chunks, the detach and its label
/// rewrite): each import finds the old, the new or the replacing set of leaves, never a leaf
/// that is half a member; serving finishes the resilver and the replace; and each leaf of the
/// final pool alone reads back every block.
#[test]
fn power_cuts_during_a_replace() {
    let seed = 4;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let legs = common::legs_with(&sim, 3, SimProfile::ssd(), LEG_BYTES, options);
    let (store, data) = setup(&sim, &legs[..2], TopSpec::Mirror, seed);
    let s = Arc::clone(&store);
    let new = spec(&legs[2]);
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.replace_leaf("leg1", new).await.unwrap();
            loop {
                s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                s.sync().await.unwrap();
                s.resilver_if_needed();
                s.detach_replaced().await;
                if s.pool().leaves().len() == 2 && s.pool().leaves_behind().is_empty() {
                    break;
                }
            }
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(paths(&store), ["leg0", "leg2"]);

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(&legs, (start, end), seed, LEG_BYTES, |after, revived, _cut, what| {
        let env = after.env();
        let specs = common::leaf_specs(&revived);
        let store = after
            .run(async move {
                let pool = Pool::import(&env, specs, "tank", &tunables()).await.unwrap();
                Arc::new(Store::open(pool, &tunables()).await.unwrap())
            })
            .unwrap()
            .0;
        let opened = paths(&store);
        assert!(
            [vec!["leg0", "leg1"], vec!["leg0", "leg1", "leg2"], vec!["leg0", "leg2"]]
                .iter()
                .any(|set| *set == opened),
            "{what}: opened with {opened:?}"
        );
        seen.insert(opened);
        settle(after, &store);
        let final_paths = paths(&store);
        assert!(
            final_paths == ["leg0", "leg1"] || final_paths == ["leg0", "leg2"],
            "{what}: ended with {final_paths:?}"
        );
        assert!(store.pool().leaves_behind().is_empty(), "{what}: a leg is still behind");
        each_leaf_alone(after, &store, &revived, &data, what);
    });
    assert!(seen.len() >= 2, "the cuts saw only {seen:?}");
}

/// Detaching the leaf that was replacing another cancels the replace: the old leaf stays, and
/// is not detached later when the resilvers are done.
#[test]
fn detaching_the_new_leaf_cancels_a_replace() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 3, SimProfile::ssd(), LEG_BYTES);
    let (store, data) = setup(&sim, &legs[..2], TopSpec::Mirror, 5);
    let s = Arc::clone(&store);
    let new = spec(&legs[2]);
    sim.run(async move {
        s.replace_leaf("leg1", new).await.unwrap();
        s.detach_leaf("leg2").await.unwrap();
    })
    .unwrap();
    assert!(!store.pool().is_replaced(store.pool().find_leaf("leg1").unwrap().guid));
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg1"], "the replace was canceled");
    each_leaf_alone(&sim, &store, &legs, &data, "after a canceled replace");
}
