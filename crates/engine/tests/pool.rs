//! Pools on simulated disks: create and import, the uberblock ring across crashes, degraded
//! and impossible imports, and the errors a person sees.

use std::sync::Arc;

use sluice_engine::device::sim::{CrashPolicy, SimImage, SimOptions};
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolError, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;

fn disk(sim: &Sim, name: &str, record: bool) -> SimDevice {
    SimDevice::new(
        &sim.env(),
        name,
        SimProfile::Instant,
        LEAF_BYTES,
        SimOptions { store_data: true, record_log: record },
    )
}

fn spec(name: &str, leaves: &[&SimDevice], mirror: bool) -> PoolSpec {
    let leaf = |d: &SimDevice| LeafSpec { path: d.name().to_owned(), device: Arc::new(d.clone()) };
    let top = if mirror {
        vec![TopSpec::Mirror(leaves.iter().map(|d| leaf(d)).collect())]
    } else {
        leaves.iter().map(|d| TopSpec::Leaf(leaf(d))).collect()
    };
    PoolSpec { name: name.to_owned(), ashift: 12, top }
}

fn candidates(devices: &[SimDevice]) -> Vec<LeafSpec> {
    devices
        .iter()
        .map(|d| LeafSpec { path: d.name().to_owned(), device: Arc::new(d.clone()) })
        .collect()
}

fn import(sim: &Sim, devices: &[SimDevice], name: &str) -> Result<Pool, PoolError> {
    let env = sim.env();
    let candidates = candidates(devices);
    let name = name.to_owned();
    sim.run(async move { Pool::import(&env, candidates, &name, &Tunables::default()).await })
        .unwrap()
        .0
}

/// Rebuilds legs "a" and "b" from crash images in a fresh world, imports the pool, and
/// returns the txg it found.
fn import_images(images: Vec<SimImage>, seed: u64) -> u64 {
    let fresh = Sim::new(seed);
    let crashed: Vec<SimDevice> = images
        .into_iter()
        .zip(["a", "b"])
        .map(|(image, name)| {
            let options = SimOptions::default();
            SimDevice::from_image(
                &fresh.env(),
                name,
                SimProfile::Instant,
                LEAF_BYTES,
                options,
                image,
            )
        })
        .collect();
    import(&fresh, &crashed, "tank").unwrap().uberblock().txg
}

/// Create writes labels and a first uberblock; import finds the same pool, layout and txg.
#[test]
fn create_then_import() {
    let sim = Sim::new(1);
    let (a, b, c) = (disk(&sim, "a", false), disk(&sim, "b", false), disk(&sim, "c", false));
    let env = sim.env();
    let s = spec("tank", &[&a, &b], true);
    let mut s2 = s.clone();
    s2.top.push(TopSpec::Leaf(LeafSpec { path: "c".into(), device: Arc::new(c.clone()) }));
    let created = sim
        .run(async move { Pool::create(&env, s2, &Tunables::default()).await.unwrap() })
        .unwrap()
        .0;
    assert_eq!(created.uberblock().txg, 1);
    let other = disk(&sim, "stranger", false);
    let pool = import(&sim, &[c.clone(), other, b.clone(), a.clone()], "tank").unwrap();
    assert_eq!(pool.guid(), created.guid());
    assert_eq!(*pool.config(), *created.config());
    assert_eq!(pool.uberblock().txg, 1);
    assert_eq!(pool.root().top_level().len(), 2);
    assert!(pool.leaves().iter().all(|l| l.present));
    // Import by guid works too.
    let by_guid = import(&sim, &[a, b, c], &format!("{:016x}", created.guid())).unwrap();
    assert_eq!(by_guid.name(), "tank");
}

/// Crashes during uberblock syncs, each leg losing, keeping, reordering or tearing its
/// unflushed writes independently, at every operation of the sync that was in progress:
/// import always succeeds and finds the last completed txg or the one being written, never an
/// older one.
#[test]
fn uberblock_ring_survives_crashes_at_every_point() {
    let sim = Sim::new(2);
    let devices = [disk(&sim, "a", true), disk(&sim, "b", true)];
    let env = sim.env();
    let s = spec("tank", &devices.iter().collect::<Vec<_>>(), true);
    let (pool, marks) = sim
        .run(async move {
            let pool = Pool::create(&env, s, &Tunables::default()).await.unwrap();
            let mut marks = Vec::new();
            for _ in 0..6 {
                let txg = pool.sync_uberblock(None).await.unwrap();
                marks.push(txg);
            }
            (pool, marks)
        })
        .unwrap()
        .0;
    drop(pool);
    // Log lengths at each completed sync are found from the flushes: every sync ends with a
    // flush of every leaf. Rebuild per-device boundaries from the write log.
    let logs: Vec<_> = devices.iter().map(|d| d.write_log()).collect();
    let flush_ends: Vec<Vec<usize>> = logs
        .iter()
        .map(|log| {
            log.iter()
                .enumerate()
                .filter(|(_, e)| e.op == sluice_engine::device::DeviceOp::Flush)
                .map(|(i, _)| i + 1)
                .collect()
        })
        .collect();
    // Create flushes each leaf once (after its uberblock); each sync_uberblock flushes twice
    // (before and after the uberblock). Sync k (txg k + 2) starts after flush 2k and completes
    // with flush 2(k + 1), counting from 0.
    let mut rng = Rng::new(7);
    let mut states = 0;
    for (k, &txg) in marks.iter().enumerate() {
        let done: Vec<usize> = flush_ends.iter().map(|f| f[2 * (k + 1)]).collect();
        let before: Vec<usize> = flush_ends.iter().map(|f| f[2 * k]).collect();
        for _ in 0..40 {
            let images: Vec<SimImage> = devices
                .iter()
                .enumerate()
                .map(|(d, dev)| {
                    let cut = before[d] + rng.below((done[d] - before[d] + 1) as u64) as usize;
                    dev.crash_image(cut, CrashPolicy::Any, &mut rng).unwrap()
                })
                .collect();
            let found = import_images(images, 3);
            assert!(
                found == txg || found == txg - 1,
                "after crash during txg {txg}: imported txg {found}"
            );
            states += 1;
        }
        // At the completion point itself the txg must be there whatever the cache held.
        let images: Vec<SimImage> = devices
            .iter()
            .enumerate()
            .map(|(d, dev)| dev.crash_image(done[d], CrashPolicy::DropAll, &mut rng).unwrap())
            .collect();
        assert_eq!(import_images(images, 4), txg);
    }
    assert!(states >= 200);
}

/// A mirror missing one child imports degraded; a top-level vdev with no child left is refused
/// with the missing leaves named.
#[test]
fn missing_leaves() {
    let sim = Sim::new(5);
    let (a, b, c) = (disk(&sim, "a", false), disk(&sim, "b", false), disk(&sim, "c", false));
    let env = sim.env();
    let mut s = spec("tank", &[&a, &b], true);
    s.top.push(TopSpec::Leaf(LeafSpec { path: "c".into(), device: Arc::new(c.clone()) }));
    sim.run(async move { Pool::create(&env, s, &Tunables::default()).await.unwrap() }).unwrap();
    let degraded = import(&sim, &[a.clone(), c.clone()], "tank").unwrap();
    let missing: Vec<_> =
        degraded.leaves().iter().filter(|l| !l.present).map(|l| l.path.clone()).collect();
    assert_eq!(missing, vec!["b".to_owned()]);
    assert!(degraded.leaves().iter().find(|l| l.path == "b").unwrap().leaf.is_faulted());
    let error = import(&sim, &[a.clone(), b.clone()], "tank").unwrap_err();
    assert!(matches!(error, PoolError::MissingLeaves { top: 1, .. }), "{error}");
    assert!(error.to_string().contains("missing: c"), "{error}");
    let error = import(&sim, &[c], "tank").unwrap_err();
    assert!(error.to_string().contains("a, b"), "{error}");
}

/// Errors a person can act on: bad names, bad layouts, small leaves, unknown or ambiguous pools.
#[test]
fn errors_say_what_to_fix() {
    let sim = Sim::new(6);
    let (a, b) = (disk(&sim, "a", false), disk(&sim, "b", false));
    let tiny =
        SimDevice::new(&sim.env(), "tiny", SimProfile::Instant, 1 << 20, SimOptions::default());
    let create = |s: PoolSpec| {
        let env = sim.env();
        sim.run(async move { Pool::create(&env, s, &Tunables::default()).await }).unwrap().0
    };
    assert!(matches!(create(spec("9lives", &[&a], false)), Err(PoolError::InvalidName { .. })));
    assert!(matches!(create(spec("has space", &[&a], false)), Err(PoolError::InvalidName { .. })));
    assert!(matches!(create(spec("tank", &[&a], true)), Err(PoolError::InvalidLayout { .. })));
    assert!(matches!(create(spec("tank", &[&a, &a], true)), Err(PoolError::InvalidLayout { .. })));
    let error = create(spec("tank", &[&tiny], false)).unwrap_err();
    assert!(
        error.to_string().contains("tiny") && error.to_string().contains("at least"),
        "{error}"
    );
    assert!(matches!(
        import(&sim, &[a.clone(), b.clone()], "tank"),
        Err(PoolError::NotFound { searched: 2, .. })
    ));
    create(spec("tank", &[&a], false)).unwrap();
    create(spec("tank", &[&b], false)).unwrap();
    let error = import(&sim, &[a, b], "tank").unwrap_err();
    assert!(matches!(error, PoolError::Ambiguous { .. }), "{error}");
}

/// A sync writes the uberblock to every label of every leaf: losing three of a leaf's four
/// labels (both ends overwritten) still imports.
#[test]
fn labels_are_redundant() {
    let sim = Sim::new(8);
    let a = disk(&sim, "a", false);
    let env = sim.env();
    let s = spec("tank", &[&a], false);
    sim.run(async move {
        let pool = Pool::create(&env, s, &Tunables::default()).await.unwrap();
        pool.sync_uberblock(None).await.unwrap();
    })
    .unwrap();
    let offsets = sluice_format::label_offsets(LEAF_BYTES);
    let d = a.clone();
    sim.run(async move {
        for &offset in &offsets[..3] {
            d.write_at(
                offset,
                sluice_engine::device::SharedBuf::copy_from(&vec![
                    0xee;
                    sluice_format::LABEL_BYTES
                        as usize
                ]),
            )
            .await
            .unwrap();
        }
        d.flush().await.unwrap();
    })
    .unwrap();
    let pool = import(&sim, std::slice::from_ref(&a), "tank").unwrap();
    assert_eq!(pool.uberblock().txg, 2);
    a.crash(CrashPolicy::DropAll);
}

/// Labels a newer sluice wrote (sluice's magic, a version beyond what this build reads): import
/// says that a newer sluice wrote them, naming the leaves and the version, rather than that no
/// pool is there; `pool create`'s probe names them too, so they are not overwritten unasked.
#[test]
fn labels_of_a_newer_sluice_are_named() {
    let sim = Sim::new(9);
    let (a, b) = (disk(&sim, "a", false), disk(&sim, "b", false));
    let env = sim.env();
    let s = spec("tank", &[&a, &b], true);
    sim.run(async move { Pool::create(&env, s, &Tunables::default()).await.unwrap() }).unwrap();
    let newer = sluice_format::LABEL_VERSION as u16 + 1;
    for d in [&a, &b] {
        // As a newer build would write them: with their checksum.
        set_label_version(&sim, d, newer, true);
    }
    let refused = import(&sim, &[a.clone(), b.clone()], "tank").expect_err("import refused");
    assert!(matches!(refused, PoolError::NewerLabels { version, .. } if version == newer));
    let said = refused.to_string();
    assert!(said.contains("a, b") && said.contains("newer sluice"), "{said}");
    assert_eq!(refused.kind(), sluice_engine::ErrorKind::NotFound);
    let found = sim
        .run(async move { sluice_engine::pool::probe::probe(&a).await.unwrap() })
        .unwrap()
        .0
        .expect("the probe finds the labels");
    assert!(found.to_string().contains(&format!("label format version {newer}")), "{found}");
}

/// A label whose version field reads 0 is damaged, not newer: import finds no pool, as for
/// any unreadable label, rather than send the user looking for a newer sluice.
#[test]
fn a_label_of_version_zero_is_not_called_newer() {
    let sim = Sim::new(10);
    let a = disk(&sim, "a", false);
    let env = sim.env();
    let s = spec("tank", &[&a], false);
    sim.run(async move { Pool::create(&env, s, &Tunables::default()).await.unwrap() }).unwrap();
    set_label_version(&sim, &a, 0, false);
    let refused = import(&sim, std::slice::from_ref(&a), "tank").expect_err("no readable label");
    assert!(matches!(refused, PoolError::NotFound { .. }), "{refused}");
}

/// Rewrites the version field of every label of `d` to `version`, and with `checksum` the
/// label's checksum after it (as a build writing that version would).
fn set_label_version(sim: &Sim, d: &SimDevice, version: u16, checksum: bool) {
    let d = d.clone();
    sim.run(async move {
        for offset in sluice_format::label_offsets(LEAF_BYTES) {
            let len = sluice_format::LABEL_HEADER_BYTES;
            let mut header = d.read_at(offset, len as u32).await.unwrap().to_vec();
            header[8..10].copy_from_slice(&version.to_le_bytes());
            if checksum {
                let sum = sluice_format::ChecksumAlg::Xxh3_128.compute(&header[..len - 16]);
                header[len - 16..].copy_from_slice(&sum.0);
            }
            let buf = sluice_engine::device::SharedBuf::copy_from(&header);
            d.write_at(offset, buf).await.unwrap();
        }
        d.flush().await.unwrap();
    })
    .unwrap();
}
