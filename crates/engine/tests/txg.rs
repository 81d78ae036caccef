//! Crash-consistency swarm for the copy-on-write core (issue: pools and txgs).
//!
//! Each seed runs a pool on a 2-way mirror of simulated SSDs through several generations. A
//! generation imports the pool, checks every byte of every volume against the model, then runs
//! random writes, zeroes, reads (checked against the in-memory model) and syncs, and ends in a
//! crash at a random virtual time, often in the middle of a sync, with each leg keeping, losing,
//! reordering or tearing its unflushed writes on its own. After the crash the pool must import
//! and hold exactly the last synced state, or the state being synced when its uberblock had
//! already reached the disk. A failure prints the seed; replay it with
//! `SLUICE_SWARM_SEED=<seed> cargo test -p sluice-engine --test txg`.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::sim::{CrashPolicy, Fault, SimImage, SimOptions};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const VOLUMES: [(&str, u64, u32); 2] = [("big", 4 << 20, 16384), ("small", 1 << 20, 4096)];

/// Crashes that cut a sync short (a code probe: the test fails if none happened).
static MID_SYNC_CRASHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[derive(Clone, Default)]
struct Model {
    /// Contents as written so far (what reads must return now).
    open: Vec<Vec<u8>>,
    /// Contents as of the last completed sync.
    synced: Vec<Vec<u8>>,
    /// Contents being synced when the crash came, if a sync was in progress.
    syncing: Option<Vec<Vec<u8>>>,
}

fn devices_from(sim: &Sim, images: Vec<SimImage>) -> Vec<SimDevice> {
    images
        .into_iter()
        .enumerate()
        .map(|(i, image)| {
            SimDevice::from_image(
                &sim.env(),
                &format!("leg{i}"),
                SimProfile::ssd(),
                LEAF_BYTES,
                SimOptions::default(),
                image,
            )
        })
        .collect()
}

fn leaf_specs(devices: &[SimDevice]) -> Vec<LeafSpec> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| LeafSpec { path: format!("leg{i}"), device: Arc::new(d.clone()) })
        .collect()
}

/// Runs one seed; returns the number of crash/import cycles.
fn run_seed(seed: u64, generations: u32) -> u32 {
    let mut rng = Rng::new(seed);
    let mut images = vec![SimImage::default(), SimImage::default()];
    let mut model = Model::default();
    for generation in 0..generations {
        let sim = Sim::new(seed.wrapping_mul(1000) + u64::from(generation));
        let env = sim.env();
        let devices = devices_from(&sim, images);
        let shared = Rc::new(RefCell::new(model.clone()));
        let steps = 10 + rng.below(40);
        let op_seed = rng.u64();
        let crash_after = Duration::from_micros(rng.below(4_000));
        let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, e, d) = (Rc::clone(&shared), env.clone(), leaf_specs(&devices));
        let (crash_flag, crash_devices) = (Arc::clone(&crashed), devices.clone());
        let main = async move {
            let tunables = Tunables::default();
            let store = if generation == 0 {
                let spec =
                    PoolSpec { name: "tank".into(), ashift: 12, top: vec![TopSpec::Mirror(d)] };
                let pool = Pool::create(&e, spec, &tunables).await.unwrap();
                let store = Store::create(pool);
                for (name, size, block) in VOLUMES {
                    store.create_volume(name, size, block).unwrap();
                }
                let contents: Vec<Vec<u8>> =
                    VOLUMES.iter().map(|(_, size, _)| vec![0u8; *size as usize]).collect();
                m.borrow_mut().syncing = Some(contents);
                store.sync().await.unwrap();
                let mut model = m.borrow_mut();
                let contents = model.syncing.take().unwrap();
                model.open = contents.clone();
                model.synced = contents;
                drop(model);
                store
            } else {
                let pool = Pool::import(&e, d, "tank", &tunables).await.unwrap();
                let store = Store::open(pool).await.unwrap();
                // The pool holds the last synced state, or the interrupted sync's if it landed.
                let mut found = Vec::new();
                for (name, size, _) in VOLUMES {
                    found.push(store.read(name, 0, size).await.unwrap());
                }
                let mut model = m.borrow_mut();
                let landed = model.syncing.take();
                if found != model.synced {
                    assert!(
                        landed.as_ref() == Some(&found),
                        "seed {seed} generation {generation}: imported contents match neither the last synced txg nor the interrupted one"
                    );
                    model.synced = found.clone();
                }
                model.open = model.synced.clone();
                drop(model);
                store
            };
            // Power is cut at a random moment of the workload, possibly mid-sync. Each leg
            // resolves its cache on its own, then stays dark: nothing issued after the cut lands.
            let (flag, legs, clock) = (Arc::clone(&crash_flag), crash_devices.clone(), e.clone());
            e.spawn("crasher", async move {
                clock.sleep(crash_after).await;
                if !flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    for leg in &legs {
                        leg.crash(CrashPolicy::Any);
                        leg.inject(Fault::Lost);
                    }
                }
            });
            let cut = || crash_flag.load(std::sync::atomic::Ordering::SeqCst);
            let mut ops = Rng::new(op_seed);
            for _ in 0..steps {
                let v = ops.below(VOLUMES.len() as u64) as usize;
                let (name, size, _) = VOLUMES[v];
                let sectors = size / 512;
                let at = ops.below(sectors);
                let len = (1 + ops.below(64)).min(sectors - at);
                let (offset, bytes) = (at * 512, len * 512);
                match ops.below(10) {
                    0..=4 => {
                        let fill = ops.u64() as u8;
                        let data: Vec<u8> =
                            (0..bytes).map(|i| fill.wrapping_add((i / 512) as u8)).collect();
                        if store.write(name, offset, &data).await.is_err() && cut() {
                            break;
                        }
                        m.borrow_mut().open[v][offset as usize..(offset + bytes) as usize]
                            .copy_from_slice(&data);
                    }
                    5 => {
                        if store.zero(name, offset, bytes).await.is_err() && cut() {
                            break;
                        }
                        m.borrow_mut().open[v][offset as usize..(offset + bytes) as usize].fill(0);
                    }
                    6..=7 => {
                        let got = match store.read(name, offset, bytes).await {
                            Ok(got) => got,
                            Err(_) if cut() => break,
                            Err(error) => panic!("seed {seed}: read failed: {error}"),
                        };
                        let expect =
                            m.borrow().open[v][offset as usize..(offset + bytes) as usize].to_vec();
                        assert!(
                            got == expect,
                            "seed {seed}: read of {name} at {offset} differs from what was written"
                        );
                    }
                    _ => {
                        let snapshot = m.borrow().open.clone();
                        m.borrow_mut().syncing = Some(snapshot);
                        match store.sync().await {
                            Ok(_) => {
                                let mut model = m.borrow_mut();
                                model.synced = model.syncing.take().unwrap();
                            }
                            Err(_) if cut() => break,
                            Err(error) => panic!("seed {seed}: sync failed: {error}"),
                        }
                    }
                }
            }
            if !cut() {
                crash_flag.store(true, std::sync::atomic::Ordering::SeqCst);
                for leg in &crash_devices {
                    leg.crash(CrashPolicy::Any);
                }
            }
        };
        if let Err(error) = sim.run(main) {
            panic!("seed {seed} generation {generation}: {error}");
        }
        model = shared.borrow().clone();
        if model.syncing.is_some() {
            MID_SYNC_CRASHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        images = devices.iter().map(SimDevice::durable_image).collect();
    }
    generations - 1
}

#[test]
fn crash_swarm() {
    if let Some(seed) = std::env::var("SLUICE_SWARM_SEED").ok().and_then(|s| s.parse().ok()) {
        run_seed(seed, 6);
        return;
    }
    let seeds: u64 =
        std::env::var("SLUICE_SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let mut cycles = 0;
    for seed in 0..seeds {
        cycles += run_seed(seed, 6);
    }
    assert!(cycles >= 5 * seeds as u32);
    let mid_sync = MID_SYNC_CRASHES.load(std::sync::atomic::Ordering::Relaxed);
    assert!(mid_sync * 10 >= cycles, "only {mid_sync} of {cycles} crashes interrupted a sync");
    eprintln!("crash swarm: {seeds} seeds, {cycles} crash/import cycles, {mid_sync} during a sync");
}
