//! `pool add` of top-level vdevs while the pool serves (crate::pool's add.rs): a mirror, a
//! RAID-Z vdev and a separate log device join; new writes spread onto them; the space
//! figures grow; the books balance (the audit); everything survives export and import; and
//! power cuts at points spread over an add and the writes after it open the pool with or
//! without the new vdev, never half of it, with every block reading back.
//!
//! And `pool remove` of separate log devices (crate::pool's remove.rs) while durable writes
//! go on: a hole keeps the other vdevs' numbers, the intent logs move to the remaining log
//! device and then to the data vdevs, the removed leaves' labels are blanked; power cuts over
//! a removal open the pool with the log device or its hole, and lose no acknowledged write.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::fm::EventClass;
use sluice_engine::pool::{LeafSpec, Pool, PoolError, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 4096;

fn tunables() -> Tunables {
    Tunables::with([("cache.bytes_max", "0")]).unwrap()
}

fn spec(device: &SimDevice) -> LeafSpec {
    LeafSpec { path: device.name().to_owned(), device: Arc::new(device.clone()) }
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

fn export_import(sim: &Sim, store: Arc<Store>, devices: &[SimDevice]) -> Arc<Store> {
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    import(sim, devices)
}

fn audit(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    let report = sim.run(async move { s.audit().await.unwrap() }).unwrap().0;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
}

/// Writes `data` to volume "w" (made as large) and syncs.
fn fill(sim: &Sim, store: &Arc<Store>, data: &[u8]) {
    let s = Arc::clone(store);
    let bytes = data.to_vec();
    sim.run(async move {
        s.create_volume("w", bytes.len() as u64, BLOCK).unwrap();
        for (i, piece) in bytes.chunks(1 << 20).enumerate() {
            s.write("w", (i as u64) << 20, piece).await.unwrap();
        }
        s.sync().await.unwrap();
    })
    .unwrap();
}

fn reads_back(sim: &Sim, store: &Arc<Store>, data: &[u8]) -> bool {
    let s = Arc::clone(store);
    let expected = data.to_vec();
    sim.run(async move {
        for (i, piece) in expected.chunks(1 << 20).enumerate() {
            let got = s.read("w", (i as u64) << 20, piece.len() as u64).await.unwrap();
            if got.as_slice() != piece {
                return false;
            }
        }
        true
    })
    .unwrap()
    .0
}

#[test]
fn a_mirror_a_raidz_and_a_log_device_are_added_while_serving() {
    let sim = Sim::new(91);
    let devices = common::legs(&sim, 8, SimProfile::ssd(), LEG_BYTES);
    let store = common::store_with_volume(
        &sim,
        &devices[..2],
        TopSpec::Mirror,
        &tunables(),
        &common::random_bytes(91, 4 << 20),
        BLOCK,
        |_| {},
    );
    let before = store.pool().data_capacity_bytes();
    // 80 MiB does not fit the first mirror's data area.
    let data = common::random_bytes(92, 80 << 20);
    let s = Arc::clone(&store);
    let too_big = data.clone();
    let full = sim
        .run(async move {
            s.create_volume("w", too_big.len() as u64, BLOCK).unwrap();
            let mut failed = false;
            for (i, piece) in too_big.chunks(1 << 20).enumerate() {
                failed |= s.write("w", (i as u64) << 20, piece).await.is_err();
            }
            failed |= s.sync().await.is_err();
            s.destroy_volume("w").await.unwrap();
            s.sync().await.unwrap();
            failed
        })
        .unwrap()
        .0;
    assert!(full, "80 MiB should not fit one 64 MiB mirror");
    let s = Arc::clone(&store);
    let (mirror, raidz, log) = (
        vec![spec(&devices[2]), spec(&devices[3])],
        devices[4..7].iter().map(spec).collect::<Vec<_>>(),
        spec(&devices[7]),
    );
    let added = sim
        .run(async move {
            s.add_vdevs(vec![
                TopSpec::Mirror(mirror),
                TopSpec::Raidz { parity: 1, leaves: raidz },
                TopSpec::Log(Box::new(TopSpec::Leaf(log))),
            ])
            .await
            .unwrap()
        })
        .unwrap()
        .0;
    assert_eq!(added.len(), 6);
    assert_eq!(store.pool().config().top.len(), 4);
    assert!(store.pool().config().top[3].log);
    assert!(store.pool().data_capacity_bytes() > 2 * before);
    fill(&sim, &store, &data);
    assert!(reads_back(&sim, &store, &data));
    // Every data vdev took some of it.
    for top in 0..3 {
        let wrote: u64 = (store.pool().leaves().iter())
            .filter(|l| l.top == top)
            .map(|l| l.leaf.stats().write_bytes.get())
            .sum();
        assert!(wrote > 4 << 20, "top {top} wrote {wrote}");
    }
    audit(&sim, &store);
    let store = export_import(&sim, store, &devices);
    assert_eq!(store.pool().config().top.len(), 4);
    assert!(reads_back(&sim, &store, &data));
    audit(&sim, &store);
    // Refused: a member again, a mirror of one, a leaf too small.
    let s = Arc::clone(&store);
    let again = spec(&devices[0]);
    let refused = sim.run(async move { s.add_vdevs(vec![TopSpec::Leaf(again)]).await }).unwrap().0;
    assert!(matches!(refused, Err(StoreError::Pool(PoolError::AlreadyMember { .. }))));
    let small = common::legs(&sim, 1, SimProfile::ssd(), 8 << 20).remove(0);
    let small = LeafSpec { path: "small".into(), device: Arc::new(small) };
    let s = Arc::clone(&store);
    let refused = sim.run(async move { s.add_vdevs(vec![TopSpec::Leaf(small)]).await }).unwrap().0;
    assert!(matches!(refused, Err(StoreError::Pool(PoolError::LeafTooSmall { .. }))));
}

/// Power cuts at points spread over an add of a mirror and the writes that follow.
#[test]
fn power_cuts_during_an_add() {
    let seed = 93;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 4, SimProfile::ssd(), LEG_BYTES, options);
    let base = common::random_bytes(seed, 4 << 20);
    let store = common::store_with_volume(
        &sim,
        &devices[..2],
        TopSpec::Mirror,
        &tunables(),
        &base,
        BLOCK,
        |_| {},
    );
    let s = Arc::clone(&store);
    let new = vec![spec(&devices[2]), spec(&devices[3])];
    let more = common::random_bytes(seed + 1, 8 << 20);
    let written = more.clone();
    let (start, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            s.add_vdevs(vec![TopSpec::Mirror(new)]).await.unwrap();
            s.create_volume("w", written.len() as u64, BLOCK).unwrap();
            for (i, piece) in written.chunks(1 << 20).enumerate() {
                s.write("w", (i as u64) << 20, piece).await.unwrap();
                s.sync().await.unwrap();
            }
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(store.pool().config().top.len(), 2);

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(
        &devices,
        (start, end),
        seed,
        LEG_BYTES,
        |after, revived, _cut, what| {
            let store = import(after, &revived);
            let tops = store.pool().config().top.len();
            let paths: Vec<String> = store.pool().leaves().iter().map(|l| l.path.clone()).collect();
            match tops {
                1 => assert_eq!(paths, ["leg0", "leg1"], "{what}"),
                2 => assert_eq!(paths, ["leg0", "leg1", "leg2", "leg3"], "{what}"),
                _ => panic!("{what}: {tops} top-level vdevs"),
            }
            seen.insert(tops);
            assert_eq!(common::read_all(after, &store, &base, BLOCK), (0, 0), "{what}");
            audit(after, &store);
            // What was synced of "w" reads back as written (a block not yet written reads zeros).
            let s = Arc::clone(&store);
            let expected = more.clone();
            let ok = after
                .run(async move {
                    let Ok(_) = s.read("w", 0, u64::from(BLOCK)).await else { return true };
                    for (i, piece) in expected.chunks(1 << 20).enumerate() {
                        let got = s.read("w", (i as u64) << 20, piece.len() as u64).await.unwrap();
                        if got.as_slice() != piece && got.iter().any(|&b| b != 0) {
                            return false;
                        }
                    }
                    true
                })
                .unwrap()
                .0;
            assert!(ok, "{what}: w has bytes it was never written");
        },
    );
    assert_eq!(seen.len(), 2, "the cuts saw only {seen:?}");
}

/// A pool of a data mirror (leg0, leg1), a log leaf (leg2) and a log mirror (leg3, leg4),
/// with volume "v" of `base`.
fn with_logs(sim: &Sim, devices: &[SimDevice], base: &[u8]) -> Arc<Store> {
    let store = common::store_with_volume(
        sim,
        &devices[..2],
        TopSpec::Mirror,
        &tunables(),
        base,
        BLOCK,
        |_| {},
    );
    let s = Arc::clone(&store);
    let (leaf, mirror) = (spec(&devices[2]), vec![spec(&devices[3]), spec(&devices[4])]);
    sim.run(async move {
        s.add_vdevs(vec![
            TopSpec::Log(Box::new(TopSpec::Leaf(leaf))),
            TopSpec::Log(Box::new(TopSpec::Mirror(mirror))),
        ])
        .await
        .unwrap()
    })
    .unwrap();
    store
}

/// Durable 4 KiB writes of `fill` to blocks `first..first + count` of "v", each acknowledged
/// before the next; returns when each was acknowledged.
async fn durable_writes(
    store: &Store,
    first: u64,
    count: u64,
    fill: impl Fn(u64) -> u8,
) -> Vec<(sluice_engine::rt::Time, u64)> {
    let mut acked = Vec::new();
    for block in first..first + count {
        let bytes = vec![fill(block); BLOCK as usize];
        store.write_durable("v", block * u64::from(BLOCK), &bytes).await.unwrap();
        acked.push((store.pool().env().now(), block));
    }
    acked
}

fn log_bytes_written(store: &Store, path: &str) -> u64 {
    let leaves = store.pool().leaves();
    let leaf = leaves.iter().find(|l| l.path == path).unwrap();
    leaf.leaf.stats().write_bytes.get()
}

fn sync_and_audit(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    sim.run(async move { s.sync().await.unwrap() }).unwrap();
    audit(sim, store);
}

fn labelled(device: &SimDevice, sim: &Sim) -> bool {
    let d = device.clone();
    sim.run(async move {
        let bytes = d.read_at(0, sluice_format::LABEL_HEADER_BYTES as u32).await.unwrap();
        sluice_format::LabelHeader::decode(&bytes).is_ok()
    })
    .unwrap()
    .0
}

#[test]
fn log_devices_are_removed_while_durable_writes_go_on() {
    let sim = Sim::new(95);
    let devices = common::legs(&sim, 5, SimProfile::ssd(), LEG_BYTES);
    let mut data = common::random_bytes(95, 4 << 20);
    let store = with_logs(&sim, &devices, &data);
    let fill = |block: u64| (block % 251) as u8 + 1;
    // Before: the log leaf takes log blocks.
    let s = Arc::clone(&store);
    sim.run(async move { durable_writes(&s, 0, 32, fill).await }).unwrap();
    assert!(log_bytes_written(&store, "leg2") > 0);
    // Refused: a data leaf, a leaf of the log mirror, a name that is nothing.
    for (name, says) in [("leg0", "holds data"), ("leg3", "remove mirror-2"), ("nope", "")] {
        let s = Arc::clone(&store);
        let refused = sim.run(async move { s.remove_log(name).await }).unwrap().0;
        match refused {
            Err(StoreError::Pool(PoolError::CannotRemove { reason, .. })) => {
                assert!(reason.contains(says), "{name}: {reason}")
            }
            Err(StoreError::Pool(PoolError::NoSuchLeaf { .. })) if name == "nope" => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    // The log leaf goes while a writer keeps acknowledging durable writes.
    let s = Arc::clone(&store);
    let (removed, acked) = sim
        .run(async move {
            let writer = durable_writes(&s, 32, 96, fill);
            let remove = async {
                let removed = s.remove_log("leg2").await;
                (removed, s.pool().env().now())
            };
            futures::join!(remove, writer)
        })
        .unwrap()
        .0;
    let (removed, removed_at) = removed;
    assert_eq!(removed.unwrap(), ["leg2"]);
    assert_eq!(acked.len(), 96);
    // The writer was answered while the removal went on, and after.
    let during = acked.iter().filter(|&&(at, _)| at < removed_at).count();
    eprintln!("acked during the removal: {during} of 96");
    assert!(during > 0 && during < 96, "{during} of 96 writes acknowledged during the removal");
    let config = store.pool().config().clone();
    assert_eq!(config.top.len(), 3);
    assert_eq!(config.top[1].kind, sluice_format::TopKind::Hole);
    assert!(config.top[2].log);
    assert!(!store.pool().leaves().iter().any(|l| l.path == "leg2"));
    assert!(!labelled(&devices[2], &sim), "the removed leaf's labels are blanked");
    let events = store.pool().events().list();
    let event = events.iter().rev().find(|e| e.class == EventClass::VdevRemove).unwrap();
    assert_eq!(event.vdev.as_deref(), Some("leg2"));
    // From now on the log mirror takes the log blocks.
    let before = log_bytes_written(&store, "leg3");
    let s = Arc::clone(&store);
    sim.run(async move { durable_writes(&s, 128, 32, fill).await }).unwrap();
    assert!(log_bytes_written(&store, "leg3") > before);
    for block in 0..160usize {
        let at = block * BLOCK as usize;
        data[at..at + BLOCK as usize].fill(fill(block as u64));
    }
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    sync_and_audit(&sim, &store);
    // The hole and the numbers survive an import; then the log mirror goes too, by the name
    // status gives it, and the data vdevs hold the logs.
    let store = export_import(
        &sim,
        store,
        &devices[..2].iter().chain(&devices[3..]).cloned().collect::<Vec<_>>(),
    );
    assert_eq!(store.pool().config().top[1].kind, sluice_format::TopKind::Hole);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let s = Arc::clone(&store);
    let removed = sim.run(async move { s.remove_log("mirror-2").await.unwrap() }).unwrap().0;
    assert_eq!(removed, ["leg3", "leg4"]);
    assert!(store.pool().log_vdevs().is_empty());
    let before = log_bytes_written(&store, "leg0");
    let s = Arc::clone(&store);
    sim.run(async move { durable_writes(&s, 160, 32, fill).await }).unwrap();
    assert!(log_bytes_written(&store, "leg0") > before);
    for block in 160..192usize {
        let at = block * BLOCK as usize;
        data[at..at + BLOCK as usize].fill(fill(block as u64));
    }
    sync_and_audit(&sim, &store);
    // A log device added later takes a new number; the holes stay.
    let s = Arc::clone(&store);
    let again = spec(&devices[2]);
    sim.run(async move {
        s.add_vdevs(vec![TopSpec::Log(Box::new(TopSpec::Leaf(again)))]).await.unwrap()
    })
    .unwrap();
    let store = export_import(&sim, store, &devices);
    let kinds: Vec<_> = store.pool().config().top.iter().map(|t| (t.kind, t.log)).collect();
    use sluice_format::TopKind::{Hole, Leaf, Mirror};
    assert_eq!(kinds, [(Mirror, false), (Hole, false), (Hole, false), (Leaf, true)]);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    sync_and_audit(&sim, &store);
}

/// Power cuts at points spread over a log device's removal while durable writes go on.
#[test]
fn power_cuts_during_a_log_device_removal() {
    let seed = 96;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let devices = common::legs_with(&sim, 5, SimProfile::ssd(), LEG_BYTES, options);
    let base = common::random_bytes(seed, 4 << 20);
    let store = with_logs(&sim, &devices, &base);
    let fill = |block: u64| (block % 241) as u8 + 7;
    let s = Arc::clone(&store);
    let (start, acked, end) = sim
        .run(async move {
            let start = s.pool().env().now();
            let (removed, acked) =
                futures::join!(s.remove_log("leg2"), durable_writes(&s, 0, 160, fill));
            removed.unwrap();
            (start, acked, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert_eq!(store.pool().config().top[1].kind, sluice_format::TopKind::Hole);

    let mut seen = std::collections::BTreeSet::new();
    common::each_power_cut(&devices, (start, end), seed, LEG_BYTES, |after, revived, cut, what| {
        let store = import(after, &revived);
        let top1 = store.pool().config().top[1].clone();
        let paths: Vec<String> = store.pool().leaves().iter().map(|l| l.path.clone()).collect();
        match top1.kind {
            sluice_format::TopKind::Hole => {
                assert_eq!(paths, ["leg0", "leg1", "leg3", "leg4"], "{what}")
            }
            sluice_format::TopKind::Leaf => {
                assert!(top1.log, "{what}");
                assert_eq!(paths, ["leg0", "leg1", "leg2", "leg3", "leg4"], "{what}");
            }
            other => panic!("{what}: top-level vdev 1 is {other:?}"),
        }
        seen.insert(top1.kind == sluice_format::TopKind::Hole);
        // Every write acknowledged before the cut is there; the rest of "v" is as it was or
        // as a write made it.
        let mut expected = base.clone();
        for &(at, block) in &acked {
            if at <= cut {
                let from = (block * u64::from(BLOCK)) as usize;
                expected[from..from + BLOCK as usize].fill(fill(block));
            }
        }
        let s = Arc::clone(&store);
        let lost = after
            .run(async move {
                let mut lost = Vec::new();
                for block in 0..160u64 {
                    let got =
                        s.read("v", block * u64::from(BLOCK), u64::from(BLOCK)).await.unwrap();
                    let from = (block * u64::from(BLOCK)) as usize;
                    let was = &expected[from..from + BLOCK as usize];
                    if got.as_slice() != was && !got.iter().all(|&b| b == fill(block)) {
                        lost.push(block);
                    }
                }
                lost
            })
            .unwrap()
            .0;
        assert!(
            lost.is_empty(),
            "{what}: blocks {lost:?} lost an acknowledged write or read garbage"
        );
        audit(after, &store);
    });
    assert_eq!(seen.len(), 2, "the cuts saw only {seen:?}");
}

/// Power off right after the sync that records a log device's hole, before any label says so
/// (fail points at both ends of the label rewrite): the import trusts the directory, so the
/// device is a hole with no space, its leaves are dropped, and the pool syncs, audits clean and
/// imports again; before the hole's sync the device is still a log device.
#[test]
fn a_crash_around_the_label_rewrite_of_a_removal() {
    use futures::FutureExt;
    use sluice_engine::device::sim::CrashPolicy;
    for (point, hole) in [("spa_vdev.remove_installed", false), ("spa_vdev.remove_labels", true)] {
        let sim = Sim::new(98);
        let options = SimOptions { store_data: true, record_log: false };
        let devices = common::legs_with(&sim, 5, SimProfile::ssd(), LEG_BYTES, options);
        let mut data = common::random_bytes(98, 4 << 20);
        let store = with_logs(&sim, &devices, &data);
        let fill = |block: u64| (block % 199) as u8 + 3;
        let s = Arc::clone(&store);
        sim.run(async move { durable_writes(&s, 0, 16, fill).await }).unwrap();
        for block in 0..16usize {
            let at = block * BLOCK as usize;
            data[at..at + BLOCK as usize].fill(fill(block as u64));
        }
        store.arm_fail_point(point);
        let s = Arc::clone(&store);
        let caught =
            sim.run(async move {
                std::panic::AssertUnwindSafe(s.remove_log("leg2")).catch_unwind().await
            })
            .unwrap()
            .0;
        assert!(caught.is_err(), "{point}: the fail point did not fire");
        drop(store);
        for device in &devices {
            device.crash(CrashPolicy::DropAll);
        }
        let store = import(&sim, &devices);
        let top1 = store.pool().config().top[1].clone();
        assert_eq!(top1.kind == sluice_format::TopKind::Hole, hole, "{point}: {top1:?}");
        let paths: Vec<String> = store.pool().leaves().iter().map(|l| l.path.clone()).collect();
        assert_eq!(paths.contains(&"leg2".to_owned()), !hole, "{point}: {paths:?}");
        assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "{point}");
        let s = Arc::clone(&store);
        sim.run(async move { durable_writes(&s, 16, 16, fill).await }).unwrap();
        for block in 16..32usize {
            let at = block * BLOCK as usize;
            data[at..at + BLOCK as usize].fill(fill(block as u64));
        }
        sync_and_audit(&sim, &store);
        let store = export_import(&sim, store, &devices);
        assert_eq!(store.pool().config().top[1].kind == sluice_format::TopKind::Hole, hole);
        assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "{point}: again");
        sync_and_audit(&sim, &store);
    }
}
