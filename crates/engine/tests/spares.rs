//! Hot spares (crate::pool's spare.rs, crate::txg's retire.rs): a leaf degraded by checksum
//! errors, or faulted by I/O errors under writes, is stood in for by an available spare,
//! which is resilvered and then alone holds everything; the spare goes back to the available
//! ones once the leaf is replaced, or cleared and resilvered, on a mirror and on RAID-Z;
//! spares are added, removed (not while in use), survive export and import, and make the
//! config name the `spares` feature; and power cuts during the spare's activation and its
//! resilver leave a pool that opens with the spare available or in use, finishes the job when
//! served, and holds every block.

use crate::common;

use std::sync::Arc;

use sluice_engine::alloc::log_region_bytes;
use sluice_engine::device::sim::{Fault, SimOptions};
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::fm::EventClass;
use sluice_engine::pool::{LeafSpec, Pool, PoolError, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_engine::vdev::{FaultReason, LeafState};
use sluice_format::{data_end_bytes, DATA_START_BYTES};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 4096;

fn tunables() -> Tunables {
    Tunables::with([("cache.bytes_max", "0"), ("scan.chunk_bytes", "1M")]).unwrap()
}

fn spec(device: &SimDevice) -> LeafSpec {
    LeafSpec { path: device.name().to_owned(), device: Arc::new(device.clone()) }
}

/// A pool "tank" of `data` (a mirror or RAID-Z over the first devices) and hot spares (the
/// last `spares` devices), with volume "v" full of random data, synced.
fn setup(
    sim: &Sim,
    devices: &[SimDevice],
    spares: usize,
    top: impl FnOnce(Vec<LeafSpec>) -> TopSpec,
    seed: u64,
) -> (Arc<Store>, Vec<u8>) {
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let split = devices.len() - spares;
    let members = devices[..split].iter().map(spec).collect();
    let spare_specs = devices[split..].iter().map(spec).collect();
    let spec = PoolSpec {
        name: "tank".into(),
        ashift: 12,
        top: vec![top(members), TopSpec::Spare(spare_specs)],
    };
    let (env, bytes) = (sim.env(), data.clone());
    let store = sim
        .run(async move {
            let pool = Pool::create(&env, spec, &tunables()).await.unwrap();
            let store = Store::create(pool, &tunables());
            store.create_volume("v", bytes.len() as u64, BLOCK).unwrap();
            store.write("v", 0, &bytes).await.unwrap();
            store.sync().await.unwrap();
            Arc::new(store)
        })
        .unwrap()
        .0;
    (store, data)
}

/// What serving does after each sync, until nothing is left to do: resilvers, detaches
/// replaced leaves, puts spares in and sends them back.
fn settle(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    sim.run(async move {
        for _ in 0..6 {
            s.sync().await.unwrap();
            s.retire().await;
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

/// (path, state, stands in for) of each spare.
fn spares(store: &Store) -> Vec<(String, &'static str, Option<String>)> {
    store.pool().spares().into_iter().map(|s| (s.path, s.state, s.stands_in_for)).collect()
}

fn export_import(sim: &Sim, store: Arc<Store>, devices: &[SimDevice]) -> Arc<Store> {
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    import(sim, devices)
}

fn import(sim: &Sim, devices: &[SimDevice]) -> Arc<Store> {
    let env = sim.env();
    let specs = common::leaf_specs(devices);
    sim.run(async move {
        let pool = Pool::import(&env, specs, "tank", &tunables()).await.unwrap();
        Arc::new(Store::open(pool, &tunables()).await.unwrap())
    })
    .unwrap()
    .0
}

/// Leaf `name` of the pool alone (the other members lost) reads back every block.
fn alone_reads_all(sim: &Sim, store: &Arc<Store>, devices: &[SimDevice], name: &str, data: &[u8]) {
    let members = paths(store);
    for other in devices.iter().filter(|d| d.name() != name && members.contains(&d.name().into())) {
        other.inject(Fault::Lost);
    }
    assert_eq!(common::read_all(sim, store, data, BLOCK), (0, 0), "{name} alone");
    for device in devices {
        device.clear_faults();
    }
    let s = Arc::clone(store);
    sim.run(async move { s.clear_leaves(None).await.unwrap() }).unwrap();
    settle(sim, store);
}

/// Where volume data starts on a leg (past the log region).
fn data_start() -> u64 {
    DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES)
}

#[test]
fn a_degraded_leaf_is_spared_and_the_spare_returns_after_a_replace() {
    let sim = Sim::new(81);
    let devices = common::legs(&sim, 4, SimProfile::ssd(), LEG_BYTES);
    let (store, data) = setup(&sim, &devices[..3], 1, TopSpec::Mirror, 81);
    assert_eq!(store.pool().config().features(), ["spares", "lz4_indirect"]);
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None)]);
    // leg1 returns garbage where a scrub reads: the scrub degrades it.
    for block in 0..64u64 {
        devices[1].inject(Fault::BitFlip { offset_bytes: data_start() + block * 4096 + 7, bit: 1 });
    }
    let s = Arc::clone(&store);
    sim.run(async move {
        s.scrub_start().unwrap();
        s.wait_scan().await;
    })
    .unwrap();
    assert_eq!(store.pool().leaves()[1].leaf.state(), LeafState::Degraded);
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    assert_eq!(paths(&store), ["leg0", "leg1", "leg2"]);
    assert!(store.pool().leaves_behind().is_empty(), "the spare is resilvered");
    let events: Vec<EventClass> = store.pool().events().list().iter().map(|e| e.class).collect();
    assert!(events.contains(&EventClass::VdevSpare), "{events:?}");
    // The spare stays in use while the degraded leaf is there; a spare in use is not removed.
    let s = Arc::clone(&store);
    let refused = sim.run(async move { s.remove_spare("leg2").await }).unwrap().0;
    assert!(matches!(refused, Err(StoreError::Pool(PoolError::SpareInUse { .. }))), "{refused:?}");
    // The spare holds everything: with leg0 lost and leg1's copies bad, every block reads.
    devices[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "leg2 serves");
    devices[0].clear_faults();
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg0")).await.unwrap() }).unwrap();
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    // Survives export and import, in use.
    let store = export_import(&sim, store, &devices);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    // Replace leg1 by leg3: once leg3 holds everything, leg1 leaves and the spare goes back.
    let s = Arc::clone(&store);
    let new = spec(&devices[3]);
    sim.run(async move { s.replace_leaf("leg1", new).await.unwrap() }).unwrap();
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg3"]);
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None)]);
    alone_reads_all(&sim, &store, &devices, "leg3", &data);
    // Its labels say available: after an import it is listed, and not a member.
    let store = export_import(&sim, store, &devices);
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None)]);
    assert_eq!(paths(&store), ["leg0", "leg3"]);
    // Removed, it leaves the config and its labels are blank.
    let s = Arc::clone(&store);
    sim.run(async move { s.remove_spare("leg2").await.unwrap() }).unwrap();
    assert!(spares(&store).is_empty());
    assert_eq!(
        store.pool().config().features(),
        ["lz4_indirect"],
        "the spare gone, its feature too"
    );
    let store = export_import(&sim, store, &devices);
    assert!(spares(&store).is_empty());
    drop(store);
}

#[test]
fn a_faulted_leaf_is_spared_under_writes_and_the_spare_returns_when_it_is_cleared() {
    let sim = Sim::new(82);
    let devices = common::legs(&sim, 4, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &devices, 2, TopSpec::Mirror, 82);
    devices[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 6, 0x51);
    assert_eq!(
        store.pool().leaves()[1].leaf.state(),
        LeafState::Faulted(FaultReason::TooManyErrors)
    );
    // The syncer's check puts the first spare that fits in, while writes go on.
    let s = Arc::clone(&store);
    let mut written = data.clone();
    let (put_in, _) = sim
        .run(async move {
            let retired = s.retire().await;
            for i in 0..8u64 {
                let at = (i * 256) << 10;
                let piece = vec![0x70 + i as u8; 64 << 10];
                s.write("v", at, &piece).await.unwrap();
            }
            s.sync().await.unwrap();
            retired
        })
        .unwrap()
        .0;
    for i in 0..8u64 {
        let at = ((i * 256) << 10) as usize;
        written[at..at + (64 << 10)].fill(0x70 + i as u8);
    }
    let data = written;
    assert_eq!(put_in, ["leg2"]);
    settle(&sim, &store);
    assert_eq!(
        spares(&store),
        [("leg2".into(), "INUSE", Some("leg1".into())), ("leg3".into(), "AVAIL", None)]
    );
    alone_reads_all(&sim, &store, &devices, "leg2", &data);
    // The device is fixed and cleared: leg1 is resilvered, then the spare goes back.
    devices[1].clear_faults();
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg1")).await.unwrap() }).unwrap();
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg1"]);
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None), ("leg3".into(), "AVAIL", None)]);
    alone_reads_all(&sim, &store, &devices, "leg1", &data);
    let detach = store.pool().events().list();
    let back = detach.iter().rev().find(|e| e.class == EventClass::VdevDetach).unwrap();
    assert_eq!((back.vdev.as_deref(), back.detail("spare")), (Some("leg2"), Some("available")));
}

#[test]
fn a_raidz_leaf_is_spared_and_the_spare_returns_after_a_replace() {
    let sim = Sim::new(83);
    let devices = common::legs(&sim, 6, SimProfile::ssd(), LEG_BYTES);
    let raidz1 = |leaves| TopSpec::Raidz { parity: 1, leaves };
    let (store, mut data) = setup(&sim, &devices[..5], 1, raidz1, 83);
    devices[2].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x33);
    assert!(matches!(store.pool().leaves()[2].leaf.state(), LeafState::Faulted(_)));
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg4".into(), "INUSE", Some("leg2".into()))]);
    assert!(store.pool().leaves_behind().is_empty());
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    // The column's spare holds it: another column lost, every block still reads.
    devices[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    devices[0].clear_faults();
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg0")).await.unwrap() }).unwrap();
    settle(&sim, &store);
    // Replace the lost leaf: the spare moves into the column, leg5 replaces it, and once
    // leg5 holds everything the spare goes back.
    let s = Arc::clone(&store);
    let new = spec(&devices[5]);
    sim.run(async move { s.replace_leaf("leg2", new).await.unwrap() }).unwrap();
    assert!(!paths(&store).contains(&"leg2".to_owned()), "{:?}", paths(&store));
    common::overwrite(&sim, &store, &mut data, 4, 0x44);
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg1", "leg5", "leg3"]);
    assert_eq!(spares(&store), [("leg4".into(), "AVAIL", None)]);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    devices[1].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "leg5 holds its column");
    devices[1].clear_faults();
    let store = export_import(&sim, store, &devices);
    assert_eq!(spares(&store), [("leg4".into(), "AVAIL", None)]);
}

#[test]
fn spares_are_added_and_removed_and_refused_where_they_do_not_fit() {
    let sim = Sim::new(84);
    let mut devices = common::legs(&sim, 3, SimProfile::ssd(), LEG_BYTES);
    let (store, _) = setup(&sim, &devices[..2], 0, TopSpec::Mirror, 84);
    assert_eq!(store.pool().config().features(), ["lz4_indirect"], "no spares, no feature");
    // Too small to hold a leg's data area: listed, but never put in.
    let small = common::legs(&sim, 1, SimProfile::ssd(), 32 << 20).remove(0);
    let small = LeafSpec { path: "small".into(), device: Arc::new(small) };
    let s = Arc::clone(&store);
    let added = spec(&devices[2]);
    sim.run(async move { s.add_spares(vec![small, added]).await.unwrap() }).unwrap();
    assert_eq!(spares(&store), [("small".into(), "AVAIL", None), ("leg2".into(), "AVAIL", None)]);
    // A member or a spare again is refused, naming it.
    for again in ["leg0", "leg2"] {
        let device = devices.iter().find(|d| d.name() == again).unwrap();
        let s = Arc::clone(&store);
        let spec = spec(device);
        let refused = sim.run(async move { s.add_spares(vec![spec]).await }).unwrap().0;
        assert!(matches!(refused, Err(StoreError::Pool(PoolError::AlreadyMember { .. }))));
    }
    devices[1].inject(Fault::Lost);
    let (store, mut data) = (store, common::random_bytes(1, VOLUME_BYTES));
    common::overwrite(&sim, &store, &mut data, 2, 0x22);
    settle(&sim, &store);
    assert_eq!(
        spares(&store),
        [("small".into(), "AVAIL", None), ("leg2".into(), "INUSE", Some("leg1".into()))],
        "the spare that fits is the one put in"
    );
    let s = Arc::clone(&store);
    sim.run(async move { s.remove_spare("small").await.unwrap() }).unwrap();
    let s = Arc::clone(&store);
    let missing = sim.run(async move { s.remove_spare("nope").await }).unwrap().0;
    assert!(matches!(missing, Err(StoreError::Pool(PoolError::NoSuchSpare { .. }))));
    // Detaching the leaf a spare stands in for keeps the spare in its place for good.
    let s = Arc::clone(&store);
    sim.run(async move { s.detach_leaf("leg1").await.unwrap() }).unwrap();
    assert!(spares(&store).is_empty());
    assert_eq!(paths(&store), ["leg0", "leg2"]);
    devices.truncate(3);
    let store = export_import(&sim, store, &devices);
    assert_eq!(paths(&store), ["leg0", "leg2"]);
}

/// Power cuts at points spread over a spare's activation and resilver (its labels, the swap's
/// sync, the label rewrite, the resilver's chunks): each import finds the spare available or
/// in use, never half a member; serving puts it in (again) and resilvers it; and the spare
/// alone with the good leg reads back every block.
#[test]
fn power_cuts_during_a_spare_activation_and_its_resilver() {
    let seed = 85;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 3, SimProfile::ssd(), LEG_BYTES, options);
    let (store, data) = setup(&sim, &devices, 1, TopSpec::Mirror, seed);
    // leg1 is gone (and stays gone in every image below), so the pool wants the spare.
    devices[1].inject(Fault::Lost);
    let s = Arc::clone(&store);
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.pool().leaves()[1].leaf.mark_gone();
            loop {
                s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                s.sync().await.unwrap();
                s.retire().await;
                s.resilver_if_needed();
                if s.pool().spares().iter().all(|p| p.state == "INUSE")
                    && s.pool().leaves_behind().is_empty()
                    && s.scan_status()
                        .is_some_and(|x| x.phase != sluice_engine::txg::ScanPhase::Scanning)
                {
                    break;
                }
            }
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    devices[1].clear_faults();

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(
        &devices,
        (start, end),
        seed,
        LEG_BYTES,
        |after, revived, _cut, what| {
            // leg1 stays dead: the spare is what must serve.
            revived[1].inject(Fault::Lost);
            let store = import(after, &revived);
            let opened: Vec<&str> = store.pool().spares().iter().map(|s| s.state).collect();
            assert!(opened == ["AVAIL"] || opened == ["INUSE"], "{what}: {opened:?}");
            seen.insert(opened.concat());
            settle(after, &store);
            assert_eq!(
                spares(&store),
                [("leg2".into(), "INUSE", Some("leg1".into()))],
                "{what}: the spare is in at the end"
            );
            assert!(store.pool().leaves_behind().is_empty(), "{what}: still behind");
            // leg0 lost too: the spare alone holds every block.
            revived[0].inject(Fault::Lost);
            assert_eq!(
                common::read_all(after, &store, &data, BLOCK),
                (0, 0),
                "{what}: spare alone"
            );
        },
    );
    assert!(seen.len() == 2, "the cuts saw only {seen:?}");
}

/// `autoreplace`: a faulted leaf whose path opens a new empty device is replaced by it (in
/// place: the old leaf is `PATH/old` until it leaves); a device there that holds something
/// (here the old leaf itself, labels and all) is left alone; with the property off, nothing
/// happens.
#[test]
fn autoreplace_takes_a_new_empty_device_at_a_faulted_leafs_path() {
    let sim = Sim::new(86);
    let devices = common::legs(&sim, 3, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &devices[..2], 0, TopSpec::Mirror, 86);
    // What the opener finds at "leg1": nothing yet.
    let at_path: Arc<std::sync::Mutex<Option<SimDevice>>> = Arc::default();
    let found = Arc::clone(&at_path);
    store.set_device_opener(Arc::new(move |path: &str| {
        let device = found.lock().unwrap().clone()?;
        (path == "leg1").then(|| LeafSpec { path: path.to_owned(), device: Arc::new(device) })
    }));
    devices[1].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x71);
    assert!(matches!(store.pool().leaves()[1].leaf.state(), LeafState::Faulted(_)));
    // Off: a new device there is not taken.
    *at_path.lock().unwrap() = Some(devices[2].clone());
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg1"]);
    let s = Arc::clone(&store);
    sim.run(async move { s.set_autoreplace(true).await.unwrap() }).unwrap();
    assert!(store.pool().properties().autoreplace);
    // On, with a device that holds something at the path (the old leaf, revived): left alone.
    let old = devices[1].clone();
    old.clear_faults();
    *at_path.lock().unwrap() = Some(old);
    let s = Arc::clone(&store);
    let replaced = sim.run(async move { s.autoreplace().await }).unwrap().0;
    assert!(replaced.is_empty(), "{replaced:?}");
    devices[1].inject(Fault::Lost);
    // A new empty device: it replaces leg1 in place, and the old leaf leaves once it holds
    // everything.
    *at_path.lock().unwrap() = Some(devices[2].clone());
    let s = Arc::clone(&store);
    let replaced = sim.run(async move { s.autoreplace().await }).unwrap().0;
    assert_eq!(replaced, ["leg1"]);
    assert_eq!(paths(&store), ["leg0", "leg1/old", "leg1"]);
    settle(&sim, &store);
    assert_eq!(paths(&store), ["leg0", "leg1"]);
    assert!(store.pool().leaves_behind().is_empty());
    devices[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "the new leg1 alone");
    devices[0].clear_faults();
    // The property survives an import.
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(None).await.unwrap() }).unwrap();
    settle(&sim, &store);
    let specs: Vec<SimDevice> = vec![devices[0].clone(), devices[2].clone()];
    let store = export_import(&sim, store, &specs);
    assert!(store.pool().properties().autoreplace);
}

/// A degraded mirror whose only spare is too small to stand in (so it stays available)
/// imports with its data area as it was: a missing leg's stand-in is sized from the legs
/// found, not from the spare's labels, which share the newest config.
#[test]
fn a_degraded_pool_with_a_small_spare_imports() {
    let sim = Sim::new(87);
    let devices = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let (store, data) = setup(&sim, &devices, 0, TopSpec::Mirror, 87);
    let small = common::legs(&sim, 1, SimProfile::ssd(), 32 << 20).remove(0);
    let s = Arc::clone(&store);
    let spare = LeafSpec { path: "small".into(), device: Arc::new(small.clone()) };
    sim.run(async move { s.add_spares(vec![spare]).await.unwrap() }).unwrap();
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    // leg1 gone: the pool opens from leg0 and the spare.
    let store = import(&sim, &[devices[0].clone(), small]);
    assert_eq!(spares(&store), [("small".into(), "AVAIL", None)]);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let (start, end) = store.pool().data_areas()[0];
    assert_eq!(end - start, data_end_bytes(LEG_BYTES) - DATA_START_BYTES);
    assert!(start >= DATA_START_BYTES);
}

/// A spare detached by hand while its leaf still ails goes back to the available ones and
/// stays there (it can then be removed): the retire agent leaves that leaf alone until `pool
/// clear`, which lets it put the spare in again.
#[test]
fn a_spare_detached_by_hand_is_not_put_straight_back() {
    let sim = Sim::new(88);
    let devices = common::legs(&sim, 3, SimProfile::ssd(), LEG_BYTES);
    let (store, mut data) = setup(&sim, &devices, 1, TopSpec::Mirror, 88);
    devices[1].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x19);
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    let s = Arc::clone(&store);
    sim.run(async move { s.detach_leaf("leg2").await.unwrap() }).unwrap();
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None)], "not put back");
    // `pool clear` of the leaf lets the agent try again: still lost, it gets the spare.
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg1")).await.unwrap() }).unwrap();
    common::overwrite(&sim, &store, &mut data, 2, 0x1a);
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// Power cuts at points spread over a spare going back (the leaf it stood in for cleared and
/// resilvered, then the spare's detach and label rewrite), a spare added and one removed:
/// each import opens with every spare available or in use and every leaf a member or not,
/// never in between; serving finishes the job; and the returned leaf alone holds every block.
#[test]
fn power_cuts_while_a_spare_goes_back_and_spares_come_and_go() {
    let seed = 89;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 4, SimProfile::ssd(), LEG_BYTES, options);
    let (store, mut data) = setup(&sim, &devices[..3], 1, TopSpec::Mirror, seed);
    devices[1].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x29);
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg2".into(), "INUSE", Some("leg1".into()))]);
    devices[1].clear_faults();
    let s = Arc::clone(&store);
    let added = spec(&devices[3]);
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.clear_leaves(Some("leg1")).await.unwrap();
            loop {
                s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                s.sync().await.unwrap();
                s.resilver_if_needed();
                s.retire().await;
                if s.pool().spares().iter().all(|p| p.state == "AVAIL") {
                    break;
                }
            }
            s.add_spares(vec![added]).await.unwrap();
            s.remove_spare("leg3").await.unwrap();
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(spares(&store), [("leg2".into(), "AVAIL", None)]);

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(
        &devices,
        (start, end),
        seed,
        LEG_BYTES,
        |after, revived, _cut, what| {
            let store = import(after, &revived);
            let opened = spares(&store);
            let leg2 = opened.iter().find(|(p, _, _)| p == "leg2").map(|(_, s, _)| *s);
            assert!(matches!(leg2, Some("AVAIL" | "INUSE")), "{what}: {opened:?}");
            assert!(
                opened.iter().all(|(p, s, _)| p == "leg2" || (p == "leg3" && *s == "AVAIL")),
                "{what}: {opened:?}"
            );
            let members = paths(&store);
            assert!(!members.contains(&"leg3".to_owned()), "{what}: {members:?}");
            seen.insert(format!("{opened:?}"));
            settle(after, &store);
            assert_eq!(
                spares(&store).iter().find(|(p, _, _)| p == "leg2").map(|(_, s, _)| *s),
                Some("AVAIL"),
                "{what}: the spare went back"
            );
            assert_eq!(paths(&store), ["leg0", "leg1"], "{what}");
            assert!(store.pool().leaves_behind().is_empty(), "{what}: still behind");
            revived[0].inject(Fault::Lost);
            assert_eq!(common::read_all(after, &store, &data, BLOCK), (0, 0), "{what}: leg1 alone");
        },
    );
    assert!(seen.len() >= 2, "the cuts saw only {seen:?}");
}

/// Power cuts at points spread over a RAID-Z replace of a leaf a spare stands in for (the new
/// leaf's labels, the sync that moves the spare into the column, the resilver, the spare going
/// back): each import opens with the spare in the column or beside the old leaf, never a
/// column of three; serving settles on one of the two; and every block reads back, with any
/// one other column lost too.
#[test]
fn power_cuts_during_a_raidz_replace_of_a_spared_leaf() {
    let seed = 90;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 6, SimProfile::ssd(), LEG_BYTES, options);
    let raidz1 = |leaves| TopSpec::Raidz { parity: 1, leaves };
    let (store, mut data) = setup(&sim, &devices[..5], 1, raidz1, seed);
    devices[2].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x3c);
    settle(&sim, &store);
    assert_eq!(spares(&store), [("leg4".into(), "INUSE", Some("leg2".into()))]);
    let s = Arc::clone(&store);
    let new = spec(&devices[5]);
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.replace_leaf("leg2", new).await.unwrap();
            loop {
                s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                s.sync().await.unwrap();
                s.resilver_if_needed();
                s.detach_replaced().await;
                s.retire().await;
                if s.pool().spares().iter().all(|p| p.state == "AVAIL") {
                    break;
                }
            }
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(paths(&store), ["leg0", "leg1", "leg5", "leg3"]);

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(
        &devices,
        (start, end),
        seed,
        LEG_BYTES,
        |after, revived, _cut, what| {
            revived[2].inject(Fault::Lost);
            let store = import(after, &revived);
            let opened = paths(&store);
            seen.insert(opened.clone());
            assert!(opened.len() <= 6, "{what}: {opened:?}");
            settle(after, &store);
            let settled = (paths(&store), spares(&store));
            let before = (
                vec!["leg0", "leg1", "leg2", "leg3", "leg4"],
                vec![("leg4".to_owned(), "INUSE", Some("leg2".to_owned()))],
            );
            let replaced =
                (vec!["leg0", "leg1", "leg5", "leg3"], vec![("leg4".to_owned(), "AVAIL", None)]);
            assert!(
                (settled.0 == before.0 && settled.1 == before.1)
                    || (settled.0 == replaced.0 && settled.1 == replaced.1),
                "{what}: settled on {settled:?}"
            );
            assert!(store.pool().leaves_behind().iter().all(|&(g, _, _)| {
                store.pool().leaves().iter().any(|l| l.guid == g && !l.present)
            }));
            assert_eq!(common::read_all(after, &store, &data, BLOCK), (0, 0), "{what}");
            revived[0].inject(Fault::Lost);
            assert_eq!(common::read_all(after, &store, &data, BLOCK), (0, 0), "{what}: leg0 lost");
        },
    );
    assert!(seen.len() >= 2, "the cuts saw only {seen:?}");
}

/// Power cuts at points spread over an in-place replace (`pool replace POOL LEAF`: a new
/// device at the lost leaf's path): each import opens with the old leaf alone, or the old and
/// the new, or the new alone; serving finishes it; and the new device with leg0 lost reads
/// back every block.
#[test]
fn power_cuts_during_an_in_place_replace() {
    let seed = 94;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 3, SimProfile::ssd(), LEG_BYTES, options);
    let (store, mut data) = setup(&sim, &devices[..2], 0, TopSpec::Mirror, seed);
    devices[1].inject(Fault::Lost);
    common::overwrite(&sim, &store, &mut data, 4, 0x4d);
    let s = Arc::clone(&store);
    let swapped = LeafSpec { path: "leg1".into(), device: Arc::new(devices[2].clone()) };
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.replace_leaf("leg1", swapped).await.unwrap();
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
    assert_eq!(paths(&store), ["leg0", "leg1"]);

    let mut seen = std::collections::BTreeSet::new();
    let mut replaced = 0;
    common::each_power_cut(
        &devices,
        (start, end),
        seed,
        LEG_BYTES,
        |after, revived, _cut, what| {
            // The old disk is gone for good.
            revived[1].inject(Fault::Lost);
            let store = import(after, &revived);
            let members = store.pool().leaves().len();
            assert!((2..=3).contains(&members), "{what}: {:?}", paths(&store));
            seen.insert(members);
            settle(after, &store);
            let new_in = store.pool().leaves().iter().any(|l| l.path == "leg2" && l.present);
            if new_in {
                replaced += 1;
                assert_eq!(store.pool().leaves().len(), 2, "{what}: {:?}", paths(&store));
                assert!(store.pool().leaves_behind().is_empty(), "{what}: still behind");
                revived[0].inject(Fault::Lost);
                let alone = common::read_all(after, &store, &data, BLOCK);
                assert_eq!(alone, (0, 0), "{what}: the new device alone");
            } else {
                // Cut before the replace's sync: the pool is as it was, leg1 missing.
                assert_eq!(common::read_all(after, &store, &data, BLOCK), (0, 0), "{what}");
            }
        },
    );
    assert!(seen.len() >= 2, "the cuts saw only {seen:?}");
    assert!(replaced > 0, "no cut came after the replace's sync");
}
