//! Setup shared by the engine's integration tests: simulated legs, the leaf specs that name
//! them, a one-mirror pool spec and a store on it, a store with a volume of data, and devices
//! rebuilt from crash images, and the images of a power cut spread over a span of time.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use sluice_engine::device::sim::{CrashPolicy, SimImage, SimOptions};
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, NewFeatures, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::{Env, Rng, Time};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_format::raidz::RaidzLayout;
use sluice_sim::Sim;

/// `count` simulated disks named leg0, leg1, ...
pub fn legs(sim: &Sim, count: usize, profile: SimProfile, len_bytes: u64) -> Vec<SimDevice> {
    legs_with(sim, count, profile, len_bytes, SimOptions::default())
}

/// As [`legs`], with the given device options (a write log for crash points, say).
pub fn legs_with(
    sim: &Sim,
    count: usize,
    profile: SimProfile,
    len_bytes: u64,
    options: SimOptions,
) -> Vec<SimDevice> {
    (0..count)
        .map(|i| {
            SimDevice::new(&sim.env(), &format!("leg{i}"), profile.clone(), len_bytes, options)
        })
        .collect()
}

/// The same disks, rebuilt from crash images in another simulated world.
pub fn revive(
    sim: &Sim,
    images: Vec<SimImage>,
    profile: SimProfile,
    len_bytes: u64,
) -> Vec<SimDevice> {
    revive_with(sim, images, profile, len_bytes, SimOptions::default())
}

/// As [`revive`], with the given device options.
pub fn revive_with(
    sim: &Sim,
    images: Vec<SimImage>,
    profile: SimProfile,
    len_bytes: u64,
    options: SimOptions,
) -> Vec<SimDevice> {
    images
        .into_iter()
        .enumerate()
        .map(|(i, image)| {
            SimDevice::from_image(
                &sim.env(),
                &format!("leg{i}"),
                profile.clone(),
                len_bytes,
                options,
                image,
            )
        })
        .collect()
}

/// A new pool's optional features with its RAID-Z vdevs' log blocks laid out as `layout`:
/// [`RaidzLayout::Striped`] makes a pool as builds before feature `raidz_log_copies` did.
pub fn features(layout: RaidzLayout) -> NewFeatures {
    NewFeatures { raidz_log_copies: layout == RaidzLayout::Copies, ..NewFeatures::ALL }
}

/// Leaf specs naming each device by its own name.
pub fn leaf_specs(devices: &[SimDevice]) -> Vec<LeafSpec> {
    devices
        .iter()
        .map(|d| LeafSpec { path: d.name().to_owned(), device: Arc::new(d.clone()) })
        .collect()
}

/// Pool "tank": one mirror of `leaves`.
pub fn mirror_pool(leaves: Vec<LeafSpec>) -> PoolSpec {
    PoolSpec { name: "tank".into(), ashift: 12, top: vec![TopSpec::Mirror(leaves)] }
}

/// A store on a freshly created pool "tank" of one mirror of `leaves`.
pub async fn mirror_store(env: &Env, leaves: Vec<LeafSpec>, tunables: &Tunables) -> Store {
    let pool = Pool::create(env, mirror_pool(leaves), tunables).await.unwrap_or_else(|e| {
        panic!("creating the test pool: {e}");
    });
    Store::create(pool, tunables)
}

/// `len` random bytes from `seed`.
pub fn random_bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.u64() as u8).collect()
}

/// A store on a fresh pool "tank" whose one top-level vdev `top` makes of `legs`, with volume
/// "v" of `data` in blocks of `block` bytes, written and synced; `prepare` runs on the store
/// first (a property of "v", say). What the tests of attach, scan, corruption and compression
/// start from.
pub fn store_with_volume(
    sim: &Sim,
    legs: &[SimDevice],
    top: impl FnOnce(Vec<LeafSpec>) -> TopSpec,
    tunables: &Tunables,
    data: &[u8],
    block: u32,
    prepare: impl FnOnce(&Store) + 'static,
) -> Arc<Store> {
    let spec = PoolSpec { name: "tank".into(), ashift: 12, top: vec![top(leaf_specs(legs))] };
    let (env, tunables, data) = (sim.env(), tunables.clone(), data.to_vec());
    sim.run(async move {
        let pool = Pool::create(&env, spec, &tunables).await.unwrap_or_else(|e| {
            panic!("creating the test pool: {e}");
        });
        let store = Store::create(pool, &tunables);
        store.create_volume("v", data.len() as u64, block).unwrap_or_else(|e| panic!("{e}"));
        prepare(&store);
        store.write("v", 0, &data).await.unwrap_or_else(|e| panic!("writing v: {e}"));
        store.sync().await.unwrap_or_else(|e| panic!("syncing: {e}"));
        Arc::new(store)
    })
    .unwrap_or_else(|e| panic!("{e}"))
    .0
}

/// Reads volume "v" block by block against `data` (the whole volume); returns (blocks that
/// failed, blocks that returned wrong bytes).
pub fn read_all(sim: &Sim, store: &Arc<Store>, data: &[u8], block: u32) -> (u64, u64) {
    let s = Arc::clone(store);
    let expected = data.to_vec();
    let block = u64::from(block);
    sim.run(async move {
        let (mut failed, mut wrong) = (0, 0);
        for index in 0..expected.len() as u64 / block {
            let at = index * block;
            match s.read("v", at, block).await {
                Ok(got) => wrong += u64::from(got != expected[at as usize..][..block as usize]),
                Err(_) => failed += 1,
            }
        }
        (failed, wrong)
    })
    .unwrap()
    .0
}

/// Writes 16 KiB of a new pattern into volume "v" at `pieces` spread offsets, a sync after
/// each, and into `data` (the whole volume) alike.
pub fn overwrite(sim: &Sim, store: &Arc<Store>, data: &mut [u8], pieces: u64, seed: u8) {
    let run = 16u64 << 10;
    let mut writes = Vec::new();
    for i in 0..pieces {
        let at = (i * 37 % (data.len() as u64 / run)) * run;
        let bytes = vec![seed.wrapping_add(i as u8); run as usize];
        data[at as usize..][..bytes.len()].copy_from_slice(&bytes);
        writes.push((at, bytes));
    }
    let s = Arc::clone(store);
    sim.run(async move {
        for (at, bytes) in writes {
            s.write("v", at, &bytes).await.unwrap();
            s.sync().await.unwrap();
        }
    })
    .unwrap();
}

/// Power cut `k` of `cuts` spread over `[start, end]` (a little jitter from `rng`): when it
/// falls, and each device's image then, every write not flushed kept or lost at random.
pub fn power_cut(
    devices: &[SimDevice],
    (start, end): (Time, Time),
    (k, cuts): (u64, u64),
    rng: &mut Rng,
) -> (Time, Vec<SimImage>) {
    let span = end.as_nanos() - start.as_nanos();
    let cut = Time::from_nanos(start.as_nanos() + span * k / cuts + rng.below(1000));
    let images = devices
        .iter()
        .map(|d| {
            let ops = d.write_log().iter().take_while(|e| e.at <= cut).count();
            (d.crash_image(ops, CrashPolicy::Any, rng))
                .unwrap_or_else(|| panic!("no crash image of {} after {ops} writes", d.name()))
        })
        .collect();
    (cut, images)
}

/// Power cuts at 13 points spread over `window` of `devices`' recorded writes (jitter seeded
/// by `seed`): for each, the devices' images revived as SSDs of `len_bytes` in a simulator of
/// their own (seed `seed * 100 + k`), handed to `check` with the cut's time and a label that
/// names it for assertion messages.
pub fn each_power_cut(
    devices: &[SimDevice],
    window: (Time, Time),
    seed: u64,
    len_bytes: u64,
    mut check: impl FnMut(&Sim, Vec<SimDevice>, Time, &str),
) {
    let mut rng = Rng::new(seed);
    let cuts = 12u64;
    for k in 0..=cuts {
        let (cut, images) = power_cut(devices, window, (k, cuts), &mut rng);
        let after = Sim::new(seed * 100 + k);
        let revived = revive(&after, images, SimProfile::ssd(), len_bytes);
        check(&after, revived, cut, &format!("seed {seed}, cut {k} of {cuts} at {cut:?}"));
    }
}

/// The simulator's spawner, counting the tasks spawned under one name, here or elsewhere, as
/// a host with two threads (so the pipeline takes its multi-threaded paths). With `drops`, it
/// drops those spawned here unrun, as a runtime shutting down does.
pub struct Counting {
    pub inner: Arc<dyn sluice_engine::rt::Spawn>,
    pub name: &'static str,
    pub spawned: Arc<std::sync::atomic::AtomicU64>,
    pub drops: bool,
}

impl sluice_engine::rt::Spawn for Counting {
    fn spawn(&self, name: &'static str, task: sluice_engine::rt::BoxFuture<()>) {
        if name == self.name {
            self.spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.drops {
                return;
            }
        }
        self.inner.spawn(name, task);
    }

    // The batches spread block by block (`Env::map_spread`) come here, under their own name.
    fn spawn_elsewhere(&self, name: &'static str, task: sluice_engine::rt::BoxFuture<()>) {
        if name == self.name {
            self.spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.spawn_elsewhere(name, task);
    }

    fn parallelism(&self) -> usize {
        2
    }
}
