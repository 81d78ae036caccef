//! Snapshots (ZFS: `zfs snapshot`, `zfs rollback`, `zfs destroy vol@snap`): a snapshot reads
//! back exactly as the volume was when it was taken while the volume keeps changing, and
//! refuses writes; several volumes' snapshots share one txg; rollback returns the volume to
//! its newest snapshot (and with `-r` past later ones); destroying snapshots in any order
//! frees exactly what `snapshot list` said each held alone; a thick volume's snapshot sets
//! aside what overwriting the volume will take; dedup volumes keep their references; all of
//! it survives export and import, with the audit balanced after every step.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError, VolumeProperty};
use sluice_engine::volume::Volume;
use sluice_format::{Compression, DedupMode};
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK: u32 = 16384;

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.u64() as u8).collect()
}

async fn audit_clean(store: &Store, step: &str) {
    let report = store.audit().await.unwrap();
    assert!(report.is_clean(), "audit after {step}: {:?}", report.problems);
}

/// Changes `blocks` random whole blocks of volume "v" (and `data` alike): most overwritten,
/// one in eight trimmed.
async fn change(store: &Store, rng: &mut Rng, data: &mut [u8], blocks: u64) {
    let count = data.len() as u64 / u64::from(BLOCK);
    for _ in 0..blocks {
        let at = rng.below(count) * u64::from(BLOCK);
        let range = at as usize..at as usize + BLOCK as usize;
        if rng.below(8) == 0 {
            store.zero("v", at, u64::from(BLOCK)).await.unwrap();
            data[range].fill(0);
        } else {
            let bytes = random(rng, BLOCK as usize);
            store.write("v", at, &bytes).await.unwrap();
            data[range].copy_from_slice(&bytes);
        }
    }
}

fn pair(volume: &str, snapshot: &str) -> (String, String) {
    (volume.to_owned(), snapshot.to_owned())
}

/// A volume "v" of random bytes on a fresh two-way mirror, compression off (random bytes
/// would not compress anyway; the figures are then exact).
async fn store_with_volume(
    env: &sluice_engine::rt::Env,
    legs: &[sluice_engine::device::SimDevice],
    rng: &mut Rng,
) -> (Store, Vec<u8>) {
    let store = common::mirror_store(env, common::leaf_specs(legs), &Tunables::default()).await;
    store.create_volume("v", VOLUME_BYTES, BLOCK).unwrap();
    store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
    let data = random(rng, VOLUME_BYTES as usize);
    store.write("v", 0, &data).await.unwrap();
    store.sync().await.unwrap();
    (store, data)
}

#[test]
fn a_snapshot_reads_back_as_taken_while_the_volume_changes() {
    let sim = Sim::new(21);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    let env2 = env.clone();
    let legs2 = legs.clone();
    sim.run(async move {
        let mut rng = Rng::new(5);
        let (store, mut data) = store_with_volume(&env, &legs, &mut rng).await;
        let store = Arc::new(store);
        // Unsynced writes are in the snapshot: it is taken by the sync of the txg they are in.
        change(&store, &mut rng, &mut data, 20).await;
        let first = data.clone();
        let txg = store.create_snapshots(&[pair("v", "first")], 1).await.unwrap();
        assert_eq!(store.snapshots("v").unwrap()[0].txg, txg);
        change(&store, &mut rng, &mut data, 100).await;
        store.sync().await.unwrap();
        audit_clean(&store, "changes after the first snapshot").await;
        let second = data.clone();
        store.create_snapshots(&[pair("v", "second")], 2).await.unwrap();
        change(&store, &mut rng, &mut data, 100).await;
        // Grown, the volume keeps its snapshots as they were.
        store.resize_volume("v", VOLUME_BYTES * 2).await.unwrap();
        data.resize(VOLUME_BYTES as usize * 2, 0);
        store.write("v", VOLUME_BYTES, &random(&mut rng, 65536)).await.unwrap();
        data[VOLUME_BYTES as usize..][..65536]
            .copy_from_slice(&store.read("v", VOLUME_BYTES, 65536).await.unwrap());
        store.sync().await.unwrap();
        for (name, expected) in [("v@first", &first), ("v@second", &second), ("v", &data)] {
            let got = store.read(name, 0, expected.len() as u64).await.unwrap();
            assert!(got == *expected, "{name} does not read back as taken");
        }
        // A snapshot's export is read-only: writes and zeroes are refused, the volume's are not.
        let export = Volume::open(&store, "v@first").unwrap();
        assert!(export.is_read_only());
        assert_eq!(export.size_bytes(), Some(VOLUME_BYTES));
        let refused = export.write(0, &[1u8; 4096], false).await.unwrap_err();
        assert!(matches!(refused, StoreError::ReadOnly { .. }), "{refused}");
        assert!(matches!(export.zero(0, 4096, true).await, Err(StoreError::ReadOnly { .. })));
        assert!(matches!(
            store.write("v@second", 0, &[1u8; 512]).await,
            Err(StoreError::ReadOnly { .. })
        ));
        export.flush().await.unwrap();
        assert_eq!(export.read(0, 4096).await.unwrap(), first[..4096]);
        let info = store.snapshots("v").unwrap();
        assert_eq!(info.len(), 2);
        assert!(info[0].txg < info[1].txg && info[1].creation_secs == 2);
        // Both reference the volume as it was (less what was trimmed); the first wrote all
        // of it, the second what changed between the two.
        assert!(info.iter().all(|s| s.referenced_bytes > VOLUME_BYTES * 3 / 4), "{info:?}");
        assert_eq!(info[0].written_bytes, info[0].referenced_bytes, "{info:?}");
        assert!(info[1].written_bytes < VOLUME_BYTES, "{info:?}");
        // Each holds alone some of what the volume overwrote after it.
        assert!(info.iter().all(|s| s.used_bytes > 0), "{info:?}");
        audit_clean(&store, "two snapshots and a grow").await;
        // A name taken, a volume that does not exist, a snapshot that does not.
        assert!(matches!(
            store.create_snapshots(&[pair("v", "first")], 3).await,
            Err(StoreError::SnapshotExists { .. })
        ));
        assert!(matches!(
            store.create_snapshots(&[pair("nope", "x")], 3).await,
            Err(StoreError::NoSuchVolume { .. })
        ));
        assert!(matches!(Volume::open(&store, "v@nope"), Err(StoreError::NoSuchSnapshot { .. })));
        assert!(store.create_snapshots(&[pair("v", "bad@name")], 3).await.is_err());
        // A volume with snapshots is destroyed only with them.
        assert!(matches!(store.destroy_volume("v").await, Err(StoreError::HasSnapshots { .. })));
        drop(export);
        let store = Arc::into_inner(store).unwrap();
        store.export().await.unwrap();
        let pool = Pool::import(&env2, common::leaf_specs(&legs2), "tank", &Tunables::default())
            .await
            .unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        for (name, expected) in [("v@first", &first), ("v@second", &second), ("v", &data)] {
            let got = store.read(name, 0, expected.len() as u64).await.unwrap();
            assert!(got == *expected, "{name} after import");
        }
        assert_eq!(store.snapshots("v").unwrap(), info);
        audit_clean(&store, "import").await;
        // Destroyed with its snapshots, the volume gives back every block.
        store.destroy_volume_with("v", true).await.unwrap();
        store.sync().await.unwrap();
        audit_clean(&store, "destroy -r").await;
    })
    .unwrap();
}

#[test]
fn snapshots_of_several_volumes_share_one_txg() {
    let sim = Sim::new(22);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let mut rng = Rng::new(6);
        let (store, _) = store_with_volume(&env, &legs, &mut rng).await;
        store.create_volume("w", VOLUME_BYTES, BLOCK).unwrap();
        store.write("w", 0, &random(&mut rng, 65536)).await.unwrap();
        let txg = store.create_snapshots(&[pair("v", "db"), pair("w", "db")], 9).await.unwrap();
        assert_eq!(store.snapshots("v").unwrap()[0].txg, txg);
        assert_eq!(store.snapshots("w").unwrap()[0].txg, txg);
        // One snapshot per volume per command; nothing is taken when one name is bad.
        assert!(store.create_snapshots(&[pair("v", "a"), pair("v", "b")], 9).await.is_err());
        assert!(store.create_snapshots(&[pair("v", "c"), pair("w", "db")], 9).await.is_err());
        assert_eq!(store.snapshots("v").unwrap().len(), 1);
        audit_clean(&store, "two volumes' snapshots").await;
    })
    .unwrap();
}

#[test]
fn rollback_returns_the_volume_to_its_snapshot() {
    let sim = Sim::new(23);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let mut rng = Rng::new(7);
        let (store, mut data) = store_with_volume(&env, &legs, &mut rng).await;
        store.create_snapshots(&[pair("v", "a")], 1).await.unwrap();
        let at_a = (data.clone(), store.volume_info("v").unwrap().space);
        change(&store, &mut rng, &mut data, 60).await;
        store.sync().await.unwrap();
        store.create_snapshots(&[pair("v", "b")], 2).await.unwrap();
        let at_b = data.clone();
        change(&store, &mut rng, &mut data, 60).await;
        store.sync().await.unwrap();
        // Unsynced writes are dropped by the rollback too.
        change(&store, &mut rng, &mut data, 10).await;
        store.rollback_volume("v", "b", false).await.unwrap();
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == at_b);
        audit_clean(&store, "rollback to the newest").await;
        // Written again, then back to the older one: refused while b exists, unless -r.
        change(&store, &mut rng, &mut data, 30).await;
        store.resize_volume("v", VOLUME_BYTES * 2).await.unwrap();
        store.write("v", VOLUME_BYTES, &random(&mut rng, 16384)).await.unwrap();
        store.sync().await.unwrap();
        let refused = store.rollback_volume("v", "a", false).await.unwrap_err();
        assert!(matches!(refused, StoreError::NotNewestSnapshot { .. }), "{refused}");
        assert!(refused.to_string().contains('b'), "{refused}");
        store.rollback_volume("v", "a", true).await.unwrap();
        let names: Vec<String> =
            store.snapshots("v").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["a"]);
        let info = store.volume_info("v").unwrap();
        assert_eq!(info.size_bytes, VOLUME_BYTES, "the size as it was");
        assert_eq!(info.space, at_a.1, "the space figures as they were");
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == at_a.0);
        // Right after a snapshot, the volume shares everything: nothing written since.
        assert_eq!(store.snapshot_space("v").unwrap().written_bytes, 0);
        audit_clean(&store, "rollback -r").await;
        // The volume goes on from there.
        let mut data = at_a.0;
        change(&store, &mut rng, &mut data, 30).await;
        store.sync().await.unwrap();
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == data);
        audit_clean(&store, "writes after the rollback").await;
    })
    .unwrap();
}

/// Destroys three snapshots in the given order and checks that each frees exactly the bytes
/// `snapshot list` said it held alone.
fn destroy_in_order(order: [usize; 3], seed: u64, dedup: bool) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let mut rng = Rng::new(seed);
        let (store, mut data) = store_with_volume(&env, &legs, &mut rng).await;
        if dedup {
            store.set_property("v", VolumeProperty::Dedup(DedupMode::On)).unwrap();
        }
        let names = ["s0", "s1", "s2"];
        let mut contents = Vec::new();
        for name in names {
            change(&store, &mut rng, &mut data, 40).await;
            if dedup {
                // Blocks that share copies, inside the volume and across snapshots.
                let copy = store.read("v", 0, 65536).await.unwrap();
                store.write("v", 65536 * 3, &copy).await.unwrap();
                data.copy_within(0..65536, 65536 * 3);
            }
            store.create_snapshots(&[pair("v", name)], 0).await.unwrap();
            contents.push(data.clone());
        }
        change(&store, &mut rng, &mut data, 40).await;
        store.sync().await.unwrap();
        audit_clean(&store, "three snapshots").await;
        for &i in &order {
            let name = names[i];
            let used = store.snapshots("v").unwrap().into_iter().find(|s| s.name == name).unwrap();
            let before = store.snapshot_space("v").unwrap().snapshots_bytes;
            store.destroy_snapshot("v", name).await.unwrap();
            let after = store.snapshot_space("v").unwrap().snapshots_bytes;
            assert_eq!(before - after, used.used_bytes, "destroying {name} ({order:?})");
            audit_clean(&store, &format!("destroying {name} ({order:?})")).await;
            assert!(matches!(
                store.read(&format!("v@{name}"), 0, 4096).await,
                Err(StoreError::NoSuchSnapshot { .. })
            ));
            // The others still read as taken.
            for left in store.snapshots("v").unwrap() {
                let k = names.iter().position(|n| *n == left.name).unwrap();
                let got = store.read(&format!("v@{}", left.name), 0, VOLUME_BYTES).await.unwrap();
                assert!(got == contents[k], "{} after destroying {name} ({order:?})", left.name);
            }
        }
        assert_eq!(store.snapshot_space("v").unwrap().snapshots_bytes, 0);
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == data);
    })
    .unwrap();
}

#[test]
fn destroying_snapshots_in_any_order_frees_what_each_held_alone() {
    for (seed, order) in
        [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]].into_iter().enumerate()
    {
        destroy_in_order(order, 30 + seed as u64, false);
    }
}

#[test]
fn dedup_volumes_keep_their_references_through_snapshots() {
    destroy_in_order([1, 0, 2], 40, true);
    destroy_in_order([2, 1, 0], 41, true);
}

#[test]
fn a_thick_volume_s_snapshot_sets_aside_its_overwrites() {
    let sim = Sim::new(24);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        let mut rng = Rng::new(8);
        let size = 8u64 << 20;
        store.create_volume_with("thick", size, BLOCK, true).unwrap();
        store.set_property("thick", VolumeProperty::Compression(Compression::Off)).unwrap();
        store.write("thick", 0, &random(&mut rng, size as usize)).await.unwrap();
        store.sync().await.unwrap();
        store.create_snapshots(&[pair("thick", "s")], 0).await.unwrap();
        // A thin volume fills the pool.
        store.create_volume("thin", 256 << 20, BLOCK).unwrap();
        store.set_property("thin", VolumeProperty::Compression(Compression::Off)).unwrap();
        let mut at = 0;
        while store.write("thin", at, &random(&mut rng, 1 << 20)).await.is_ok() {
            at += 1 << 20;
            store.sync().await.unwrap();
        }
        // Every block of the thick volume is overwritten: the snapshot keeps the old ones,
        // and the space for the new ones was set aside when it was taken.
        for at in (0..size).step_by(1 << 20) {
            store.write("thick", at, &random(&mut rng, 1 << 20)).await.unwrap();
        }
        store.sync().await.unwrap();
        audit_clean(&store, "overwrites of a thick volume with a snapshot").await;
        // Now a second snapshot would need the volume's size again, which the pool lacks.
        let refused = store.create_snapshots(&[pair("thick", "t")], 0).await.unwrap_err();
        assert!(matches!(refused, StoreError::SnapshotNeedsSpace { .. }), "{refused}");
        assert_eq!(store.snapshots("thick").unwrap().len(), 1);
    })
    .unwrap();
}

#[test]
fn a_clone_diverges_without_touching_its_origin_and_promote_swaps_them() {
    let sim = Sim::new(25);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    let env2 = env.clone();
    let legs2 = legs.clone();
    sim.run(async move {
        let mut rng = Rng::new(9);
        let (store, mut data) = store_with_volume(&env, &legs, &mut rng).await;
        store.create_snapshots(&[pair("v", "a")], 1).await.unwrap();
        let at_a = data.clone();
        change(&store, &mut rng, &mut data, 40).await;
        store.create_snapshots(&[pair("v", "b")], 2).await.unwrap();
        let at_b = data.clone();
        change(&store, &mut rng, &mut data, 40).await;
        store.create_snapshots(&[pair("v", "c")], 3).await.unwrap();
        let at_c = data.clone();
        change(&store, &mut rng, &mut data, 40).await;
        store.sync().await.unwrap();
        // A clone of b starts as b, thin, and takes no space of its own.
        store.clone_snapshot("v", "b", "web").await.unwrap();
        let clone = store.volume_info("web").unwrap();
        assert_eq!((clone.size_bytes, clone.reservation_bytes), (VOLUME_BYTES, 0));
        assert_eq!(store.snapshot_space("web").unwrap().written_bytes, 0);
        assert!(store.read("web", 0, VOLUME_BYTES).await.unwrap() == at_b);
        assert_eq!(store.snapshots("v").unwrap()[1].clones, ["web"]);
        audit_clean(&store, "a clone").await;
        // It diverges; the volume and its snapshots do not move.
        let mut web = at_b.clone();
        let blocks = VOLUME_BYTES / u64::from(BLOCK);
        for _ in 0..30 {
            let at = rng.below(blocks) * u64::from(BLOCK);
            let bytes = random(&mut rng, BLOCK as usize);
            store.write("web", at, &bytes).await.unwrap();
            web[at as usize..][..BLOCK as usize].copy_from_slice(&bytes);
        }
        store.sync().await.unwrap();
        store.create_snapshots(&[pair("web", "w1")], 4).await.unwrap();
        store.write("web", 0, &random(&mut rng, 65536)).await.unwrap();
        web[..65536].copy_from_slice(&store.read("web", 0, 65536).await.unwrap());
        store.sync().await.unwrap();
        for (name, expected) in
            [("v", &data), ("v@a", &at_a), ("v@b", &at_b), ("v@c", &at_c), ("web", &web)]
        {
            assert!(store.read(name, 0, VOLUME_BYTES).await.unwrap() == *expected, "{name}");
        }
        assert!(store.snapshot_space("web").unwrap().written_bytes > 0);
        audit_clean(&store, "a clone that diverged").await;
        // Its origin cannot be destroyed (the error names the clone), nor rolled back past.
        let refused = store.destroy_snapshot("v", "b").await.unwrap_err();
        assert!(matches!(refused, StoreError::HasClones { .. }), "{refused}");
        assert!(refused.to_string().contains("web"), "{refused}");
        assert!(matches!(
            store.rollback_volume("v", "a", true).await,
            Err(StoreError::HasClones { .. })
        ));
        assert!(store.destroy_volume_with("v", true).await.is_err());
        // Snapshots before and after the origin can go.
        store.destroy_snapshot("v", "c").await.unwrap();
        audit_clean(&store, "destroying the snapshot after the origin").await;
        // Promote: a and b move to the clone, and v becomes a clone of b.
        store.promote_volume("web").await.unwrap();
        let names = |volume: &str| -> Vec<String> {
            store.snapshots(volume).unwrap().into_iter().map(|s| s.name).collect()
        };
        assert_eq!(names("web"), ["a", "b", "w1"]);
        assert!(names("v").is_empty());
        assert_eq!(store.snapshots("web").unwrap()[1].clones, ["v"]);
        assert!(matches!(
            store.promote_volume("web").await,
            Err(StoreError::InvalidProperty { .. })
        ));
        for (name, expected) in [("v", &data), ("web@a", &at_a), ("web@b", &at_b), ("web", &web)] {
            assert!(store.read(name, 0, VOLUME_BYTES).await.unwrap() == *expected, "{name}");
        }
        audit_clean(&store, "promote").await;
        // The old parent, a clone now, can be destroyed; the snapshots it came with stay.
        store.destroy_volume("v").await.unwrap();
        store.sync().await.unwrap();
        audit_clean(&store, "destroying the old parent").await;
        assert!(store.read("web@a", 0, VOLUME_BYTES).await.unwrap() == at_a);
        // Survives an import, then every snapshot goes, in an order of its own.
        let store = Arc::new(store);
        let store = Arc::into_inner(store).unwrap();
        store.export().await.unwrap();
        let pool = Pool::import(&env2, common::leaf_specs(&legs2), "tank", &Tunables::default())
            .await
            .unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        assert!(store.read("web", 0, VOLUME_BYTES).await.unwrap() == web);
        audit_clean(&store, "import after promote").await;
        for name in ["b", "w1", "a"] {
            store.destroy_snapshot("web", name).await.unwrap();
            audit_clean(&store, &format!("destroying web@{name}")).await;
        }
        assert_eq!(store.snapshot_space("web").unwrap().snapshots_bytes, 0);
        assert!(store.read("web", 0, VOLUME_BYTES).await.unwrap() == web);
    })
    .unwrap();
}

#[test]
fn destroying_a_clone_frees_only_its_own_blocks() {
    let sim = Sim::new(26);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let mut rng = Rng::new(10);
        let (store, mut data) = store_with_volume(&env, &legs, &mut rng).await;
        store.create_snapshots(&[pair("v", "s")], 1).await.unwrap();
        let at_s = data.clone();
        change(&store, &mut rng, &mut data, 20).await;
        store.sync().await.unwrap();
        let before = store.audit().await.unwrap().allocated_bytes;
        store.clone_snapshot("v", "s", "c1").await.unwrap();
        store.clone_snapshot("v", "s", "c2").await.unwrap();
        for clone in ["c1", "c2"] {
            for i in 0..10u64 {
                store.write(clone, i * 65536, &random(&mut rng, 16384)).await.unwrap();
            }
            store.sync().await.unwrap();
            store.create_snapshots(&[pair(clone, "x")], 0).await.unwrap();
            store.write(clone, 0, &random(&mut rng, 16384)).await.unwrap();
        }
        store.sync().await.unwrap();
        audit_clean(&store, "two clones").await;
        assert!(store.destroy_volume("c1").await.is_err(), "it has a snapshot");
        store.destroy_volume_with("c1", true).await.unwrap();
        store.destroy_volume_with("c2", true).await.unwrap();
        // Freed only after the deferral; then the pool holds what it held before the clones.
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        let report = store.audit().await.unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert!(store.read("v@s", 0, VOLUME_BYTES).await.unwrap() == at_s);
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == data);
        // Metadata (the directory, space maps) may differ by a few blocks.
        let diff = report.allocated_bytes.abs_diff(before);
        assert!(
            diff < 64 << 10,
            "allocated {before} before the clones, {} after",
            report.allocated_bytes
        );
        store.destroy_snapshot("v", "s").await.unwrap();
        audit_clean(&store, "the origin, once its clones are gone").await;
    })
    .unwrap();
}

#[test]
fn rollback_of_a_dedup_volume_with_unsynced_writes() {
    let sim = Sim::new(27);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let mut rng = Rng::new(11);
        let (store, _) = store_with_volume(&env, &legs, &mut rng).await;
        store.set_property("v", VolumeProperty::Dedup(DedupMode::On)).unwrap();
        let pattern = random(&mut rng, BLOCK as usize);
        for i in 0..4u64 {
            store.write("v", i * u64::from(BLOCK), &pattern).await.unwrap();
        }
        store.sync().await.unwrap();
        store.create_snapshots(&[pair("v", "s")], 0).await.unwrap();
        let at_s = store.read("v", 0, VOLUME_BYTES).await.unwrap();
        // Unsynced: new copies, shares of the snapshot's copy and of each other.
        let other = random(&mut rng, BLOCK as usize);
        for i in 10..14u64 {
            store.write("v", i * u64::from(BLOCK), &pattern).await.unwrap();
            store.write("v", (i + 10) * u64::from(BLOCK), &other).await.unwrap();
        }
        store.rollback_volume("v", "s", false).await.unwrap();
        assert!(store.read("v", 0, VOLUME_BYTES).await.unwrap() == at_s);
        audit_clean(&store, "rollback over unsynced dedup writes").await;
    })
    .unwrap();
}
