//! Crash-consistency swarm for the copy-on-write core (issue: pools and txgs).
//!
//! Each seed runs a pool on a 2-way mirror of simulated SSDs through several generations. A
//! generation imports the pool, checks every byte of every volume against the model, then runs
//! random writes, zeroes, reads (checked against the in-memory model) and syncs, and ends in a
//! crash at a random virtual time, often in the middle of a sync, with each leg keeping, losing,
//! reordering or tearing its unflushed writes on its own. After the crash the pool must import
//! and hold exactly the last synced state, or the state being synced when its uberblock had
//! already reached the disk. Snapshots are taken, destroyed and rolled back to, and a clone
//! made, promoted and destroyed, at random points too (each a sync of its own); after every
//! import every volume and snapshot must read back as the model says, each clone must name its
//! origin, and the audit (space, dedup references, dead lists) must balance. A failure prints
//! the seed; replay it with `SLUICE_SWARM_SEED=<seed> cargo test -p sluice-engine --test txg`,
//! adding `SLUICE_SWARM_TRACE=1` to print each operation.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::sim::{CrashPolicy, Fault, SimImage};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_format::DedupMode;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;

const VOLUMES: [(&str, u64, u32); 3] =
    [("big", 4 << 20, 16384), ("small", 1 << 20, 4096), ("dd", 1 << 20, 4096)];
/// The volume with dedup on; its writes draw from few patterns, so blocks are shared.
const DEDUP_VOLUME: usize = 2;

/// Dedup work seen across the swarm (code probes: the test fails if there was none).
static DEDUP_SHARED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static DEDUP_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Crashes that cut a sync short (a code probe: the test fails if none happened).
static MID_SYNC_CRASHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Snapshot changes seen across the swarm (a code probe: the test fails if there were none).
static SNAPSHOT_OPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Clones made, promoted or destroyed (likewise).
static CLONE_OPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A change the model says must be refused because a snapshot has clones.
fn expect_has_clones(result: Result<(), StoreError>, seed: u64, cut: &dyn Fn() -> bool) {
    match result {
        Err(StoreError::HasClones { .. }) => {}
        Err(_) if cut() => {}
        other => panic!("seed {seed}: expected a refusal naming clones, got {other:?}"),
    }
}
/// Snapshots kept per volume at most.
const SNAPSHOTS_MAX: usize = 3;

/// The volume slot clones are made in, after the fixed `VOLUMES`.
const CLONE: &str = "cl";

fn volume_name(v: usize) -> &'static str {
    VOLUMES.get(v).map_or(CLONE, |v| v.0)
}

/// What the pool holds: each volume's contents (the clone slot's empty while it has none),
/// its snapshots' (by name, oldest first), and a clone's origin (volume slot, snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Contents {
    volumes: Vec<Vec<u8>>,
    snapshots: Vec<Vec<(String, Vec<u8>)>>,
    origins: Vec<Option<(usize, String)>>,
}

impl Contents {
    /// Whether a volume's snapshot `name` has clones.
    fn cloned(&self, v: usize, name: &str) -> bool {
        self.origins.iter().flatten().any(|(o, n)| *o == v && n == name)
    }
}

/// Everything the store holds, as a [`Contents`].
async fn found_contents(store: &Store) -> Contents {
    let mut found = Contents::default();
    let entries = store.volumes();
    for v in 0..=VOLUMES.len() {
        let name = volume_name(v);
        let Some(entry) = entries.iter().find(|e| e.name == name) else {
            found.volumes.push(Vec::new());
            found.snapshots.push(Vec::new());
            found.origins.push(None);
            continue;
        };
        found.volumes.push(store.read(name, 0, entry.size_bytes).await.unwrap());
        let mut snapshots = Vec::new();
        for snapshot in &entry.snapshots {
            let at = format!("{name}@{}", snapshot.name);
            let size = snapshot.size_bytes;
            snapshots.push((snapshot.name.clone(), store.read(&at, 0, size).await.unwrap()));
        }
        found.snapshots.push(snapshots);
        found.origins.push(entry.origin.map(|origin| {
            entries
                .iter()
                .find_map(|e| {
                    let s = e.snapshots.iter().find(|s| s.id == origin.snapshot)?;
                    let slot = (0..=VOLUMES.len()).find(|&v| volume_name(v) == e.name)?;
                    Some((slot, s.name.clone()))
                })
                .expect("a clone's origin is a snapshot of a volume")
        }));
    }
    found
}

#[derive(Clone, Default)]
struct Model {
    /// Contents as written so far (what reads must return now).
    open: Contents,
    /// Contents as of the last completed sync.
    synced: Contents,
    /// Contents being synced when the crash came, if a sync was in progress.
    syncing: Option<Contents>,
    /// Snapshots taken so far, for fresh names.
    taken: u64,
}

/// Runs one seed; returns the number of crash/import cycles.
fn run_seed(seed: u64, generations: u32) -> u32 {
    let mut rng = Rng::new(seed);
    let mut images = vec![SimImage::default(), SimImage::default()];
    let mut model = Model::default();
    for generation in 0..generations {
        let sim = Sim::new(seed.wrapping_mul(1000) + u64::from(generation));
        let env = sim.env();
        let devices = common::revive(&sim, images, SimProfile::ssd(), LEAF_BYTES);
        let shared = Rc::new(RefCell::new(model.clone()));
        let steps = 10 + rng.below(40);
        let op_seed = rng.u64();
        let crash_after = Duration::from_micros(rng.below(4_000));
        let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, e, d) = (Rc::clone(&shared), env.clone(), common::leaf_specs(&devices));
        let (crash_flag, crash_devices) = (Arc::clone(&crashed), devices.clone());
        let main = async move {
            let tunables = Tunables::default();
            let store = if generation == 0 {
                let spec = common::mirror_pool(d);
                let pool = Pool::create(&e, spec, &tunables).await.unwrap();
                let store = Store::create(pool, &tunables);
                for (name, size, block) in VOLUMES {
                    store.create_volume(name, size, block).unwrap();
                }
                store.set_dedup(VOLUMES[DEDUP_VOLUME].0, DedupMode::On).unwrap();
                let mut volumes: Vec<Vec<u8>> =
                    VOLUMES.iter().map(|(_, size, _)| vec![0u8; *size as usize]).collect();
                volumes.push(Vec::new());
                let contents = Contents {
                    volumes,
                    snapshots: vec![Vec::new(); VOLUMES.len() + 1],
                    origins: vec![None; VOLUMES.len() + 1],
                };
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
                let store = Store::open(pool, &tunables).await.unwrap();
                // The pool holds the last synced state, or the interrupted sync's if it landed.
                let found = found_contents(&store).await;
                {
                    let mut model = m.borrow_mut();
                    let landed = model.syncing.take();
                    if found != model.synced {
                        assert!(
                            landed.as_ref() == Some(&found),
                            "seed {seed} generation {generation}: imported contents match neither the last synced txg nor the interrupted one; replay with SLUICE_SWARM_SEED={seed} cargo test -p sluice-engine --test txg crash_swarm"
                        );
                        model.synced = found.clone();
                    }
                    model.open = model.synced.clone();
                }
                // Reference counts and space balance after every crash and import.
                let audit = store.audit().await.unwrap();
                assert!(
                    audit.is_clean(),
                    "seed {seed} generation {generation}: audit after import: {:#?}",
                    audit.problems
                );
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
                let mut v = ops.below(VOLUMES.len() as u64 + 1) as usize;
                if m.borrow().open.volumes[v].is_empty() {
                    v = 0;
                }
                let name = volume_name(v);
                let size = m.borrow().open.volumes[v].len() as u64;
                let sectors = size / 512;
                let at = ops.below(sectors);
                let len = (1 + ops.below(64)).min(sectors - at);
                let (offset, bytes) = (at * 512, len * 512);
                let op = ops.below(12);
                if std::env::var_os("SLUICE_SWARM_TRACE").is_some() {
                    eprintln!("gen {generation}: op {op} on {name}");
                }
                match op {
                    0..=4 => {
                        let fill =
                            if v == DEDUP_VOLUME { ops.below(3) as u8 } else { ops.u64() as u8 };
                        let data: Vec<u8> =
                            (0..bytes).map(|i| fill.wrapping_add((i / 512) as u8)).collect();
                        if store.write(name, offset, &data).await.is_err() && cut() {
                            break;
                        }
                        m.borrow_mut().open.volumes[v][offset as usize..(offset + bytes) as usize]
                            .copy_from_slice(&data);
                    }
                    5 => {
                        if store.zero(name, offset, bytes).await.is_err() && cut() {
                            break;
                        }
                        m.borrow_mut().open.volumes[v][offset as usize..(offset + bytes) as usize]
                            .fill(0);
                    }
                    6..=7 => {
                        // The volume, or one of its snapshots.
                        let (source, expect) = {
                            let model = m.borrow();
                            let snapshots = &model.open.snapshots[v];
                            let pick = ops.below(snapshots.len() as u64 + 1) as usize;
                            let range = offset as usize..(offset + bytes) as usize;
                            match snapshots.get(pick) {
                                Some((snap, contents)) => {
                                    (format!("{name}@{snap}"), contents[range].to_vec())
                                }
                                None => (name.to_owned(), model.open.volumes[v][range].to_vec()),
                            }
                        };
                        let got = match store.read(&source, offset, bytes).await {
                            Ok(got) => got,
                            Err(_) if cut() => break,
                            Err(error) => panic!("seed {seed}: read failed: {error}"),
                        };
                        assert!(
                            got == expect,
                            "seed {seed}: read of {source} at {offset} differs from what was written"
                        );
                    }
                    8 => {
                        // A snapshot taken, destroyed, or rolled back to: a sync of its own.
                        let (name_taken, pick) = {
                            let mut model = m.borrow_mut();
                            model.taken += 1;
                            let count = model.open.snapshots[v].len() as u64;
                            (format!("s{}", model.taken), ops.below(count.max(1)) as usize)
                        };
                        let kind = ops.below(3);
                        let count = m.borrow().open.snapshots[v].len();
                        if std::env::var_os("SLUICE_SWARM_TRACE").is_some() {
                            eprintln!("  snapshot kind {kind}, {count} snapshots, pick {pick}");
                        }
                        let result = if count == 0 || (kind == 0 && count < SNAPSHOTS_MAX) {
                            {
                                let mut model = m.borrow_mut();
                                let contents = model.open.volumes[v].clone();
                                model.open.snapshots[v].push((name_taken.clone(), contents));
                                model.syncing = Some(model.open.clone());
                            }
                            let names = [(name.to_owned(), name_taken)];
                            store.create_snapshots(&names, 0).await.map(|_| ())
                        } else if kind == 1 {
                            let gone = m.borrow().open.snapshots[v][pick].0.clone();
                            if m.borrow().open.cloned(v, &gone) {
                                let refused = store.destroy_snapshot(name, &gone).await;
                                expect_has_clones(refused, seed, &cut);
                                continue;
                            }
                            {
                                let mut model = m.borrow_mut();
                                model.open.snapshots[v].remove(pick);
                                model.syncing = Some(model.open.clone());
                            }
                            store.destroy_snapshot(name, &gone).await
                        } else {
                            let (to, refused) = {
                                let model = m.borrow();
                                let later = &model.open.snapshots[v][pick + 1..];
                                let refused = later.iter().any(|(n, _)| model.open.cloned(v, n));
                                (model.open.snapshots[v][pick].0.clone(), refused)
                            };
                            if refused {
                                let refused = store.rollback_volume(name, &to, true).await;
                                expect_has_clones(refused, seed, &cut);
                                continue;
                            }
                            {
                                let mut model = m.borrow_mut();
                                model.open.snapshots[v].truncate(pick + 1);
                                let contents = model.open.snapshots[v][pick].1.clone();
                                model.open.volumes[v] = contents;
                                model.syncing = Some(model.open.clone());
                            }
                            store.rollback_volume(name, &to, true).await
                        };
                        if std::env::var_os("SLUICE_SWARM_TRACE").is_some() {
                            eprintln!("  -> {result:?}");
                        }
                        match result {
                            Ok(()) => {
                                SNAPSHOT_OPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let mut model = m.borrow_mut();
                                model.synced = model.syncing.take().unwrap();
                            }
                            Err(_) if cut() => break,
                            Err(error) => panic!("seed {seed}: snapshot change failed: {error}"),
                        }
                    }
                    9 => {
                        // A clone made from a snapshot, promoted, or destroyed.
                        let slot = VOLUMES.len();
                        let result = if m.borrow().open.volumes[slot].is_empty() {
                            let source = {
                                let model = m.borrow();
                                let with: Vec<usize> = (0..slot)
                                    .filter(|&s| !model.open.snapshots[s].is_empty())
                                    .collect();
                                if with.is_empty() {
                                    continue;
                                }
                                let s = with[ops.below(with.len() as u64) as usize];
                                let pick = ops.below(model.open.snapshots[s].len() as u64);
                                (s, model.open.snapshots[s][pick as usize].clone())
                            };
                            let (s, (snapshot, contents)) = source;
                            {
                                let mut model = m.borrow_mut();
                                model.open.volumes[slot] = contents;
                                model.open.snapshots[slot].clear();
                                model.open.origins[slot] = Some((s, snapshot.clone()));
                                model.syncing = Some(model.open.clone());
                            }
                            store.clone_snapshot(volume_name(s), &snapshot, CLONE).await
                        } else if ops.below(2) == 0 {
                            // Promote one of the clones (the slot's, or a volume a promote made
                            // a clone).
                            let clones: Vec<usize> = {
                                let model = m.borrow();
                                (0..=slot).filter(|&c| model.open.origins[c].is_some()).collect()
                            };
                            if clones.is_empty() {
                                continue;
                            }
                            let c = clones[ops.below(clones.len() as u64) as usize];
                            {
                                let mut model = m.borrow_mut();
                                let open = &mut model.open;
                                let (p, s) = open.origins[c].clone().unwrap();
                                let at =
                                    open.snapshots[p].iter().position(|(n, _)| *n == s).unwrap();
                                let moved: Vec<_> = open.snapshots[p].drain(..=at).collect();
                                let own = std::mem::take(&mut open.snapshots[c]);
                                open.snapshots[c] = moved.iter().cloned().chain(own).collect();
                                open.origins[c] = open.origins[p].take();
                                open.origins[p] = Some((c, s));
                                // Other clones of the moved snapshots follow them.
                                for (o, origin) in open.origins.iter_mut().enumerate() {
                                    if let Some((from, n)) = origin {
                                        if o != p && *from == p && moved.iter().any(|(m, _)| m == n)
                                        {
                                            *from = c;
                                        }
                                    }
                                }
                                model.syncing = Some(model.open.clone());
                            }
                            store.promote_volume(volume_name(c)).await
                        } else {
                            let refused = {
                                let model = m.borrow();
                                model.open.origins.iter().flatten().any(|(o, _)| *o == slot)
                            };
                            if refused {
                                let refused = store.destroy_volume_with(CLONE, true).await;
                                expect_has_clones(refused, seed, &cut);
                                continue;
                            }
                            {
                                let mut model = m.borrow_mut();
                                model.open.volumes[slot].clear();
                                model.open.snapshots[slot].clear();
                                model.open.origins[slot] = None;
                            }
                            // Destroyed with the next sync.
                            let destroyed = store.destroy_volume_with(CLONE, true).await;
                            let snapshot = m.borrow().open.clone();
                            m.borrow_mut().syncing = Some(snapshot);
                            match destroyed {
                                Ok(()) => store.sync().await.map(|_| ()),
                                Err(error) => Err(error),
                            }
                        };
                        match result {
                            Ok(()) => {
                                CLONE_OPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                let mut model = m.borrow_mut();
                                model.synced = model.syncing.take().unwrap();
                            }
                            Err(_) if cut() => break,
                            Err(error) => panic!("seed {seed}: clone change failed: {error}"),
                        }
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
            let stats = store.dedup_table().stats();
            DEDUP_SHARED.fetch_add(stats.blocks_shared.get(), std::sync::atomic::Ordering::Relaxed);
            DEDUP_DROPPED
                .fetch_add(stats.references_dropped.get(), std::sync::atomic::Ordering::Relaxed);
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
        std::env::var("SLUICE_SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let mut cycles = 0;
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| run_seed(seed, 8)) {
            Ok(done) => cycles += done,
            Err(panic) => {
                eprintln!(
                    "crash swarm failed at seed {seed}; replay it alone with \
                     SLUICE_SWARM_SEED={seed} cargo test -p sluice-engine --test txg crash_swarm"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    assert!(cycles >= 7 * seeds as u32);
    let mid_sync = MID_SYNC_CRASHES.load(std::sync::atomic::Ordering::Relaxed);
    assert!(mid_sync * 10 >= cycles, "only {mid_sync} of {cycles} crashes interrupted a sync");
    let shared = DEDUP_SHARED.load(std::sync::atomic::Ordering::Relaxed);
    let dropped = DEDUP_DROPPED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        shared > 0 && dropped > 0,
        "dedup shared {shared} blocks and dropped {dropped} references"
    );
    let snapshot_ops = SNAPSHOT_OPS.load(std::sync::atomic::Ordering::Relaxed);
    assert!(snapshot_ops >= seeds, "only {snapshot_ops} snapshot changes completed");
    let clone_ops = CLONE_OPS.load(std::sync::atomic::Ordering::Relaxed);
    assert!(clone_ops >= seeds / 2, "only {clone_ops} clone changes completed");
    eprintln!(
        "crash swarm: {seeds} seeds, {cycles} crash/import cycles, {mid_sync} during a sync; \
         dedup: {shared} blocks shared, {dropped} references dropped; {snapshot_ops} snapshot \
         changes, {clone_ops} clones made, promoted or destroyed; every import audited"
    );
}

/// A full pool (F9): writes get a no-space error naming the pool, the pool still syncs and
/// imports, every block written before the error reads back, and after a range is zeroed and
/// its txg has synced past the deferral, writes succeed again.
#[test]
fn full_pool_refuses_writes_then_recovers() {
    let sim = Sim::new(77);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 16 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let (written, error_text) = sim
        .run(async move {
            let spec = PoolSpec {
                name: "small".into(),
                ashift: 12,
                top: vec![TopSpec::Mirror(specs.clone())],
            };
            let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
            let store = Store::create(pool, &Tunables::default());
            // Sparse and larger than the pool: thin provisioning.
            store.create_volume("thin", 64 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            let chunk = vec![0x5au8; 256 << 10];
            let mut written = 0u64;
            let error = loop {
                match store.write("thin", written, &chunk).await {
                    Ok(_) => written += chunk.len() as u64,
                    Err(error) => break error,
                }
                store.sync().await.unwrap();
            };
            assert!(matches!(error, sluice_engine::txg::StoreError::NoSpace { .. }), "{error}");
            // Full, the pool still syncs (from the slop reserve) and reads back what it took.
            store.sync().await.unwrap();
            assert!(store.read("thin", 0, written).await.unwrap().iter().all(|&b| b == 0x5a));
            // Free the first half; the space returns once the freeing txg is past the deferral.
            store.zero("thin", 0, written / 2).await.unwrap();
            for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 1) {
                store.sync().await.unwrap();
            }
            store.write("thin", 0, &chunk).await.unwrap();
            store.sync().await.unwrap();
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "small", &Tunables::default()).await.unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store
                .read("thin", 0, chunk.len() as u64)
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0x5a));
            assert!(store
                .read("thin", written / 2, written / 2)
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0x5a));
            (written, error.to_string())
        })
        .unwrap()
        .0;
    assert!(written >= 8 << 20, "only {written} bytes fit in a 16 MiB mirror");
    assert!(error_text.contains("small") && error_text.contains("trim"), "{error_text}");
}

/// Random 4 KiB overwrites of a nearly full pool: every txg rewrites indirect blocks all over
/// the volume, and each overwrite needs new space while the old block waits out its deferral.
/// Writes may be refused (NoSpace), but every sync must succeed: a sync that runs out of space
/// suspends the pool. (Found by the peers benchmark on a 4 KiB-block volume.)
#[test]
fn random_overwrites_of_a_full_pool_never_fail_a_sync() {
    let sim = Sim::new(79);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 24 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let refused = sim
        .run(async move {
            let spec = PoolSpec {
                name: "tight".into(),
                ashift: 12,
                top: vec![TopSpec::Mirror(specs.clone())],
            };
            let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
            let store = Store::create(pool, &Tunables::default());
            let blocks = 4096u64;
            store.create_volume("v", blocks * 4096, 4096).unwrap();
            let mut model = vec![1u8; (blocks * 4096) as usize];
            store.write("v", 0, &model).await.unwrap();
            store.sync().await.unwrap();
            let mut rng = Rng::new(4);
            let mut refused = 0u32;
            for round in 0..40u32 {
                for _ in 0..600 {
                    let block = rng.below(blocks);
                    let at = (block * 4096) as usize;
                    let byte = (round % 250) as u8 + 2;
                    match store.write("v", at as u64, &[byte; 4096]).await {
                        Ok(_) => model[at..at + 4096].fill(byte),
                        Err(error) => {
                            assert!(
                                matches!(error, sluice_engine::txg::StoreError::NoSpace { .. }),
                                "{error}"
                            );
                            refused += 1;
                        }
                    }
                }
                store.sync().await.unwrap();
            }
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tight", &Tunables::default()).await.unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store.read("v", 0, blocks * 4096).await.unwrap() == model);
            refused
        })
        .unwrap()
        .0;
    eprintln!("refused {refused} writes");
}

/// A pool whose free space is fragmented into thousands of 4 KiB holes (every other block of
/// a full volume trimmed) keeps syncing and importing: its space map, far larger than any
/// free range, is written in small pieces. (A single-block map needed a contiguous range of
/// the map's size and suspended the pool, found by the peers benchmark at 80% full.)
#[test]
fn fragmented_pool_syncs_and_imports() {
    let sim = Sim::new(78);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let spec =
            PoolSpec { name: "frag".into(), ashift: 12, top: vec![TopSpec::Mirror(specs.clone())] };
        let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
        let store = Store::create(pool, &Tunables::default());
        let blocks = 10_000u64;
        store.create_volume("v", blocks * 4096, 4096).unwrap();
        let data: Vec<u8> = (0..blocks * 4096).map(|i| (i / 4096) as u8 | 1).collect();
        for chunk in 0..10 {
            let range =
                (chunk * blocks / 10 * 4096) as usize..((chunk + 1) * blocks / 10 * 4096) as usize;
            store.write("v", range.start as u64, &data[range]).await.unwrap();
            store.sync().await.unwrap();
        }
        for block in (0..blocks).step_by(2) {
            store.zero("v", block * 4096, 4096).await.unwrap();
        }
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        // Fill the holes again with fresh copies: allocations land in the 4 KiB holes.
        for block in (1..blocks).step_by(2).take(2000) {
            store
                .write(
                    "v",
                    block * 4096,
                    &data[(block * 4096) as usize..((block + 1) * 4096) as usize],
                )
                .await
                .unwrap();
        }
        store.sync().await.unwrap();
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "frag", &Tunables::default()).await.unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        for block in [1u64, 3, 4001, 9999] {
            let got = store.read("v", block * 4096, 4096).await.unwrap();
            assert_eq!(
                got,
                data[(block * 4096) as usize..((block + 1) * 4096) as usize],
                "block {block}"
            );
        }
        assert!(store.read("v", 0, 4096).await.unwrap().iter().all(|&b| b == 0));
    })
    .unwrap();
}

/// A txg's blocks, written by the client at random offsets, reach the disk in spans: a few
/// device writes per leg instead of one per block. Each block still has its own pointer: all
/// read back, after an import too, and scrub checks every one against its own checksum. The
/// indirect blocks written stay cached for the next txg.
#[test]
fn random_writes_reach_the_disk_in_spans() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let spec = PoolSpec {
            name: "spans".into(),
            ashift: 12,
            top: vec![TopSpec::Mirror(specs.clone())],
        };
        let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
        let store = Store::create(pool, &Tunables::default());
        let blocks = 1024u64;
        store.create_volume("v", blocks * 4096, 4096).unwrap();
        store.sync().await.unwrap();
        let pattern = |block: u64| -> Vec<u8> {
            (0..4096u64).map(|i| (block.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8).collect()
        };
        let mut order: Vec<u64> = (0..blocks).collect();
        let mut rng = Rng::new(9);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let before: Vec<u64> = legs.iter().map(|leg| leg.stats().writes).collect();
        for &block in &order {
            store.write("v", block * 4096, &pattern(block)).await.unwrap();
        }
        store.sync().await.unwrap();
        for (leg, before) in legs.iter().zip(before) {
            // 4 MiB of data in 1 MiB spans, the 8 indirect blocks above it in one, then the
            // root, the space map, the directory and the labels: 13 here, against 1,040 when
            // every block was written on its own.
            let writes = leg.stats().writes - before;
            assert!(writes <= 24, "{writes} device writes for {blocks} blocks");
        }
        // The indirect blocks just written are cached: the next txg rewrites them without
        // reading any back.
        let reads: Vec<u64> = legs.iter().map(|leg| leg.stats().reads).collect();
        store.write("v", 77 * 4096, &pattern(77)).await.unwrap();
        store.sync().await.unwrap();
        for (leg, before) in legs.iter().zip(reads) {
            assert_eq!(leg.stats().reads, before, "the sync read indirect blocks back");
        }
        let scrubbed = store.pool().scrub().await.unwrap();
        assert!(scrubbed.errors == 0 && scrubbed.blocks > blocks, "{scrubbed:?}");
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "spans", &Tunables::default()).await.unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        for block in 0..blocks {
            let got = store.read("v", block * 4096, 4096).await.unwrap();
            assert!(got == pattern(block), "block {block} reads back wrong");
        }
    })
    .unwrap();
}

/// A sync caches the data blocks it writes, so 4 KiB writes into 16 KiB blocks written by an
/// earlier sync merge with the cached bytes instead of reading each block back; and the blocks a
/// sync frees leave the cache, so overwriting the volume again and again does not fill it with
/// dead versions.
#[test]
fn partial_overwrites_of_recently_written_blocks_read_nothing() {
    let sim = Sim::new(12);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let pool =
            Pool::create(&env, common::mirror_pool(specs.clone()), &tunables).await.unwrap();
        let store = Store::create(pool, &tunables);
        let (blocks, block) = (256u64, 16384u64);
        store.create_volume("v", blocks * block, block as u32).unwrap();
        store.write("v", 0, &vec![0x5a; (blocks * block) as usize]).await.unwrap();
        store.sync().await.unwrap();
        let cached_after_fill = store.pool().cache().bytes();
        assert!(cached_after_fill >= blocks * block, "{cached_after_fill} bytes cached");
        let reads = |legs: &[SimDevice]| legs.iter().map(|l| l.stats().reads).sum::<u64>();
        let before = reads(&legs);
        for round in 0..4u64 {
            // One 4 KiB piece per block, a different one each round; every block is synced
            // (and so replaced) each round.
            for b in 0..blocks {
                let at = b * block + (round % 4) * 4096;
                store.write("v", at, &[round as u8 + 1; 4096]).await.unwrap();
            }
            store.sync().await.unwrap();
        }
        assert_eq!(reads(&legs), before, "partial writes read their blocks back");
        let cached = store.pool().cache().bytes();
        assert!(
            cached <= cached_after_fill + cached_after_fill / 4,
            "{cached} bytes cached after four overwrites of {cached_after_fill}: freed blocks stayed"
        );
        for b in 0..blocks {
            let got = store.read("v", b * block, block).await.unwrap();
            for (piece, bytes) in got.chunks(4096).enumerate() {
                assert!(bytes.iter().all(|&x| x == piece as u8 + 1), "block {b} piece {piece}");
            }
        }
        // The same bytes come back from the disk.
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = Store::open(pool, &tunables).await.unwrap();
        let got = store.read("v", 0, blocks * block).await.unwrap();
        for (piece, bytes) in got.chunks(4096).enumerate() {
            assert!(bytes.iter().all(|&x| x == (piece % 4) as u8 + 1), "piece {piece} on disk");
        }
    })
    .unwrap();
}

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

/// `len` bytes that do not compress, from `seed`.
fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).step_by(8).flat_map(|_| rng.u64().to_le_bytes()).take(len).collect()
}

/// Checks that volume "v" holds, in each `chunk` of its first `volume` bytes, what pass `pass`
/// wrote there: `incompressible(pass << 32 | offset, chunk)`.
async fn assert_incompressible(store: &Store, volume: u64, chunk: u64, pass: u64) {
    for at in (0..volume).step_by(chunk as usize) {
        let got = store.read("v", at, chunk).await.unwrap();
        assert!(got == incompressible(pass << 32 | at, chunk as usize), "pass {pass} at {at}");
    }
}

/// A dirty-data maximum larger than the pool can hold: writers streaming over a volume that
/// fills a third of a small pool are slowed by syncs started early and by delays, both sized
/// to the free space, rather than stopped at the space check for a whole sync each time
/// (before, only `txg.dirty_max` started syncs and set the delays, and the syncing txg's
/// allocations counted twice).
#[test]
fn a_pool_smaller_than_the_dirty_maximum_throttles_by_free_space() {
    let sim = Sim::new(91);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let tunables =
        Tunables::with([("txg.timeout_ms", "3600000"), ("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let volume = 20u64 << 20;
        store.create_volume("v", volume, 16384).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        // Four passes over the volume: 80 MiB through a pool of 64 MiB, each pass's blocks
        // replacing the last pass's (freed, and held two more txgs).
        let chunk = 64u64 << 10;
        for pass in 0..4u64 {
            for at in (0..volume).step_by(chunk as usize) {
                store
                    .write("v", at, &incompressible(pass << 32 | at, chunk as usize))
                    .await
                    .unwrap();
            }
        }
        let throttle = store.throttle_stats();
        // Slowed, not stopped: the few waits left (a sync of the txgs before may still be
        // running when the writer gets to the wall) take less time than the delays.
        let (delayed, waited) =
            (throttle.delayed_nanos.get(), throttle.waited_for_space_nanos.get());
        assert!(delayed > waited, "delayed {delayed} ns, waited for space {waited} ns");
        assert_eq!(throttle.waited_for_sync.get(), 0);
        assert!(store.syncs() >= 4, "{} syncs: none started for the free space", store.syncs());
        store.sync().await.unwrap();
        assert_incompressible(&store, volume, chunk, 3).await;
    })
    .unwrap();
}

/// Writers that meet the space check together wait for one sync, not one each: a writer
/// whose turn comes after a sync ended looks at the space again before syncing itself (each
/// syncing in turn made the last writer wait for every other's sync).
#[test]
fn writers_short_of_space_share_a_sync() {
    let sim = Sim::new(92);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    // No syncer and no dirty limit to reach: only the space check syncs.
    let tunables = Tunables::with([("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let volume = 40u64 << 20;
        store.create_volume("v", volume, 16384).unwrap();
        let chunk = 64u64 << 10;
        for at in (0..volume).step_by(chunk as usize) {
            store.write("v", at, &incompressible(at, chunk as usize)).await.unwrap();
        }
        store.sync().await.unwrap();
        let before = store.syncs();
        // Four writers overwrite a quarter each.
        let quarter = volume / 4;
        let writers = (0..4u64).map(|w| {
            let store = store.clone();
            async move {
                for at in (w * quarter..(w + 1) * quarter).step_by(chunk as usize) {
                    let data = incompressible(1 << 32 | at, chunk as usize);
                    store.write("v", at, &data).await.unwrap();
                }
            }
        });
        futures::future::join_all(writers).await;
        let waits = store.throttle_stats().waited_for_space.get();
        let syncs = store.syncs() - before;
        assert!(waits >= 4, "{waits} waits: the writers never met the space check together");
        assert!(syncs < waits, "{syncs} syncs for {waits} waits: each writer synced for itself");
        store.sync().await.unwrap();
        assert_incompressible(&store, volume, chunk, 1).await;
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

/// Volumes resize and are destroyed: growing past what the tree's levels address keeps every
/// block and adds levels; shrinking drops the blocks past the end and frees their space;
/// destroying frees the whole tree. All of it survives export and import.
#[test]
fn resize_and_destroy_volumes() {
    let sim = Sim::new(99);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let spec = common::mirror_pool(specs.clone());
        let store = Store::create(Pool::create(&env, spec, &tunables).await.unwrap(), &tunables);
        // 64 blocks of 4 KiB: one level of indirection.
        store.create_volume("v", 64 * 4096, 4096).unwrap();
        store.create_volume("gone", 1 << 20, 4096).unwrap();
        store.write("v", 0, &[1; 4096]).await.unwrap();
        store.write("v", 63 * 4096, &[2; 4096]).await.unwrap();
        store.write("gone", 0, &vec![3; 1 << 20]).await.unwrap();
        store.sync().await.unwrap();
        let full = store.free_bytes();
        // Grow to 1000 blocks: needs two levels; old blocks stay, new space is writable.
        store.resize_volume("v", 1000 * 4096).await.unwrap();
        store.write("v", 999 * 4096, &[4; 4096]).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![1; 4096]);
        assert_eq!(store.read("v", 63 * 4096, 4096).await.unwrap(), vec![2; 4096]);
        // Shrink to 32 blocks: block 63 and 999 go; reads past the end are refused.
        store.resize_volume("v", 32 * 4096).await.unwrap();
        assert!(store.read("v", 63 * 4096, 4096).await.is_err());
        store.destroy_volume("gone").await.unwrap();
        assert!(store.read("gone", 0, 4096).await.is_err());
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        // Less what the two-level tree that remains (each indirect block in two copies) and
        // the space maps and directory (in two and three copies) of the later txgs hold.
        let free = store.free_bytes();
        assert!(
            free > full + (1 << 20) - 4 * 65536,
            "destroyed and cut blocks were freed: {free} free, {full} before"
        );
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &tunables).await.unwrap(), &tunables)
                .await
                .unwrap();
        let volumes = store.volumes();
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].size_bytes, 32 * 4096);
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![1; 4096]);
        // Growing again exposes zeros, not the old block 63.
        store.resize_volume("v", 64 * 4096).await.unwrap();
        assert_eq!(store.read("v", 63 * 4096, 4096).await.unwrap(), vec![0; 4096]);
    })
    .unwrap();
}

/// A volume's allocation map, asserting that a read's map (`read_with_status`, what NBD reads
/// use) agrees with `block_status`, and its data with `read`.
async fn block_status_checked(store: &Store, offset: u64, len: u64) -> Vec<(u64, bool)> {
    let status = store.block_status("v", offset, len).await.unwrap();
    let (data, runs) = store.read_with_status("v", offset, len).await.unwrap();
    assert_eq!(runs, status, "the read's map at {offset}+{len}");
    assert_eq!(data.to_vec(), store.read("v", offset, len).await.unwrap(), "the read's data");
    status
}

/// Holes are reported as such: never-written, trimmed and zeroed ranges are holes (and read as
/// zeros), written ones are data, before and after a sync, and a read's map agrees.
#[test]
fn block_status_reports_holes() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let spec = common::mirror_pool(specs);
        let store = Store::create(Pool::create(&env, spec, &tunables).await.unwrap(), &tunables);
        store.create_volume("v", 1 << 20, 4096).unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, vec![(1 << 20, false)]);
        store.write("v", 8192, &[1; 8192]).await.unwrap();
        let expected = vec![(8192, false), (8192, true), ((1 << 20) - 16384, false)];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, expected);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, expected);
        // A partial write over a synced block and one over a hole, both still in memory.
        store.write("v", 8192 + 512, &[2; 512]).await.unwrap();
        store.write("v", 40960 + 1024, &[3; 1024]).await.unwrap();
        let patched = vec![
            (8192, false),
            (8192, true),
            (40960 - 16384, false),
            (4096, true),
            ((1 << 20) - 45056, false),
        ];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, patched);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, patched);
        store.zero("v", 40960, 4096).await.unwrap();
        // A zeroed block in memory, not yet synced, is a hole.
        store.zero("v", 8192, 4096).await.unwrap();
        let after = vec![(12288, false), (4096, true), ((1 << 20) - 16384, false)];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, after);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, after);
        assert_eq!(store.read("v", 8192, 4096).await.unwrap(), vec![0; 4096]);
        // Partial ranges are clipped to the request.
        assert_eq!(block_status_checked(&store, 12800, 1024).await, vec![(1024, true)]);
        assert_eq!(
            block_status_checked(&store, 11776, 1024).await,
            vec![(512, false), (512, true)]
        );
    })
    .unwrap();
}

/// Partial-block writes are kept as patches over the version below, read only when needed.
/// Here they land while syncs run (so patches stack over a syncing txg's patches), and every
/// read, during the run and after an import, must see exactly what was written.
#[test]
fn partial_writes_during_syncs_read_back() {
    partial_writes_during_syncs(Tunables::default());
}

/// The same under write pressure (a small dirty limit): writers complete their patches
/// themselves, racing the quiesces of the syncer.
#[test]
fn partial_writes_under_pressure_read_back() {
    let mut t = Tunables::default();
    t.set("txg.dirty_max", "1M").unwrap();
    partial_writes_during_syncs(t);
}

fn partial_writes_during_syncs(t: Tunables) {
    let sim = Sim::new(21);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let pool = Pool::create(&env, common::mirror_pool(specs.clone()), &t).await.unwrap();
        let store = Arc::new(Store::create(pool, &t));
        const SIZE: u64 = 256 << 10;
        store.create_volume("v", SIZE, 16384).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        let first: Vec<u8> = (0..SIZE).map(|i| (i / 512) as u8).collect();
        store.write("v", 0, &first).await.unwrap();
        model.copy_from_slice(&first);
        store.sync().await.unwrap();
        let syncing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (s, flag, e) = (Arc::clone(&store), Arc::clone(&syncing), env.clone());
        env.spawn("syncer", async move {
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                s.sync().await.unwrap();
                e.sleep(Duration::from_micros(50)).await;
            }
        });
        let mut rng = Rng::new(3);
        for step in 0..3000u32 {
            let sectors = SIZE / 512;
            let at = rng.below(sectors);
            let len = (1 + rng.below(8)).min(sectors - at);
            let (offset, bytes) = (at * 512, len * 512);
            if rng.below(4) == 0 {
                let got = store.read("v", offset, bytes).await.unwrap();
                assert!(
                    got[..] == model[offset as usize..(offset + bytes) as usize],
                    "step {step}: read at {offset}+{bytes} differs"
                );
            } else {
                let data: Vec<u8> = (0..bytes).map(|_| rng.u64() as u8).collect();
                store.write("v", offset, &data).await.unwrap();
                model[offset as usize..(offset + bytes) as usize].copy_from_slice(&data);
            }
            if step % 3 == 0 {
                env.sleep(Duration::from_micros(30)).await;
            }
        }
        syncing.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(store.syncs() > 20, "only {} syncs ran among the writes", store.syncs());
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), model);
        store.sync().await.unwrap();
        let store =
            Arc::try_unwrap(store).unwrap_or_else(|_| panic!("syncer still holds the store"));
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &t).await.unwrap(), &t).await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), model);
    })
    .unwrap();
}

/// Several writers patch the same few blocks (each its own sectors), through the volume front
/// so each completes its own patches, while a syncer quiesces txgs: a writer completing its patch must not apply a newer patch over a
/// base read before a quiesce moved the layers. Every sector must hold its writer's last value.
#[test]
fn concurrent_patches_across_quiesces_keep_every_sector() {
    let sim = Sim::new(33);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let mut t = Tunables::default();
        t.set("txg.dirty_max", "1M").unwrap();
        let pool = Pool::create(&env, common::mirror_pool(specs), &t).await.unwrap();
        let store = Arc::new(Store::create(pool, &t));
        const SIZE: u64 = 512 << 10;
        const WRITERS: u64 = 8;
        store.create_volume("v", SIZE, 16384).unwrap();
        store.write("v", 0, &vec![0xee; SIZE as usize]).await.unwrap();
        store.sync().await.unwrap();
        let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (s, flag, e) = (Arc::clone(&store), Arc::clone(&running), env.clone());
        env.spawn("syncer", async move {
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                s.sync().await.unwrap();
                e.sleep(Duration::from_micros(20)).await;
            }
        });
        let (done_tx, done_rx) = futures::channel::mpsc::unbounded::<Vec<(u64, u8)>>();
        for w in 0..WRITERS {
            // Through the volume front, which counts requests in flight: with several, each
            // writer completes its own patches.
            let s = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            let (e, done) = (env.clone(), done_tx.clone());
            env.spawn("writer", async move {
                let mut rng = Rng::new(100 + w);
                let mut last = std::collections::BTreeMap::new();
                for _ in 0..1500 {
                    // Sectors of this writer only: sector % WRITERS == w.
                    let sector = rng.below(SIZE / 512 / WRITERS) * WRITERS + w;
                    let value = rng.u64() as u8;
                    s.write(sector * 512, &[value; 512], false).await.unwrap();
                    let back = s.read(sector * 512, 512).await.unwrap();
                    assert!(back == [value; 512], "writer {w}: sector {sector} lost its write");
                    last.insert(sector, value);
                    if rng.below(2) == 0 {
                        e.sleep(Duration::from_micros(rng.below(20))).await;
                    }
                }
                done.unbounded_send(last.into_iter().collect()).unwrap();
            });
        }
        drop(done_tx);
        let mut expected = vec![0xeeu8; SIZE as usize];
        let finished: Vec<Vec<(u64, u8)>> = futures::StreamExt::collect(done_rx).await;
        assert_eq!(finished.len() as u64, WRITERS);
        for (sector, value) in finished.into_iter().flatten() {
            expected[(sector * 512) as usize..((sector + 1) * 512) as usize].fill(value);
        }
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(store.syncs() > 20, "only {} syncs ran among the writes", store.syncs());
        let got = store.read("v", 0, SIZE).await.unwrap();
        let bad = (0..SIZE / 512).find(|&s| {
            got[(s * 512) as usize..((s + 1) * 512) as usize]
                != expected[(s * 512) as usize..((s + 1) * 512) as usize]
        });
        assert!(bad.is_none(), "sector {bad:?} lost its writer's last value");
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), expected);
    })
    .unwrap();
}

/// The volume front counts every answered request per type, across all handles, with its
/// bytes and its latency from arrival to answer; errors are counted too.
#[test]
fn volumes_count_requests_and_their_latency() {
    use sluice_engine::stats::VolumeOp;
    let sim = Sim::new(32);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs, &t).await);
        store.create_volume("v", 4 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let a = sluice_engine::volume::Volume::open(&store, "v").unwrap();
        let b = sluice_engine::volume::Volume::open(&store, "v").unwrap();
        for i in 0..3u64 {
            a.write(i * 4096, &[1; 4096], false).await.unwrap();
        }
        b.write(65536, &[2; 8192], true).await.unwrap();
        // The FUA write made everything before it durable; this one leaves the flush work.
        a.write(12288, &[1; 4096], false).await.unwrap();
        // A whole block: the only write that is not partial.
        b.write(16384 * 8, &[3; 16384], false).await.unwrap();
        a.flush().await.unwrap();
        assert_eq!(b.read(0, 4096).await.unwrap(), vec![1; 4096]);
        b.zero(0, 16384, false).await.unwrap();
        assert!(a.read(8 << 20, 4096).await.is_err(), "a read beyond the end must fail");
        let stats = store.volume_stats("v").unwrap();
        let requests = |op: VolumeOp| stats.requests[op.index()].get();
        assert_eq!(
            VolumeOp::ALL.map(requests),
            [2, 6, 1, 1],
            "reads, writes, flushes, zeroes counted over both handles"
        );
        assert_eq!(stats.write_bytes.get(), 4 * 4096 + 8192 + 16384);
        assert_eq!(stats.partial_writes.get(), 5, "writes covering part of a 16 KiB block");
        assert_eq!(stats.read_bytes.get(), 4096, "the failed read moved no bytes");
        assert_eq!(stats.errors.get(), 1);
        for op in VolumeOp::ALL {
            assert_eq!(stats.latency[op.index()].count(), requests(op), "{op:?} latencies");
        }
        // The flush waited for the log's device write and flush (300 us on this SSD model);
        // the plain writes only for memory.
        let flush = stats.latency[VolumeOp::Flush.index()].mean();
        assert!(flush >= Duration::from_micros(300), "flush latency {flush:?}");
        assert!(stats.latency[VolumeOp::Write.index()].quantile(0.5) < flush);
        assert!(store.volume_stats("nope").is_err());
    })
    .unwrap();
}

/// A lone writer that flushes after every write gets its log writes started early
/// (`intent_log.early_commit=auto`): its flushes find the records already on their way. Writes
/// that stream without flushes stop it within two records, `off` never does it, and what was
/// written early is durable the same way: it reads back after an export and import.
#[test]
fn a_lone_sync_writer_commits_early() {
    for setting in ["auto", "off"] {
        let sim = Sim::new(31);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        let setting = setting.to_owned();
        sim.run(async move {
            let t = Tunables::with([("intent_log.early_commit", setting.as_str())]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
            store.create_volume("v", 4 << 20, 16384).unwrap();
            // The chain must be anchored by a sync before the log is used at all.
            store.sync().await.unwrap();
            let volume = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            for i in 0..64u64 {
                volume.write(i * 4096, &[i as u8 + 1; 4096], false).await.unwrap();
                volume.flush().await.unwrap();
            }
            let early = store.log_stats().early_commits.get();
            if setting == "auto" {
                assert!(early >= 48, "{early} early commits for 64 write-flush pairs");
            } else {
                assert_eq!(early, 0, "early commits with intent_log.early_commit=off");
            }
            for i in 64..128u64 {
                volume.write(i * 4096, &[i as u8 + 1; 4096], false).await.unwrap();
                // Let each write's early commit (if any) finish before the next.
                env.sleep(Duration::from_millis(1)).await;
            }
            let streaming = store.log_stats().early_commits.get() - early;
            assert!(streaming <= 2, "{streaming} early commits for 64 writes with no flush");
            volume.flush().await.unwrap();
            drop(volume);
            let Ok(store) = Arc::try_unwrap(store) else { panic!("a task still holds the store") };
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            for i in 0..128u64 {
                let got = store.read("v", i * 4096, 4096).await.unwrap();
                assert!(got == [i as u8 + 1; 4096], "block {i} after import");
            }
        })
        .unwrap();
    }
}

/// The same for a lone writer of large writes, logged by pointer, under every commit policy
/// that commits early: each write is many records (one per block), which `auto` must not take
/// for many writers. The volume reads back whole after an export and import.
#[test]
fn a_lone_writer_of_large_writes_commits_early() {
    for policy in ["auto", "pipelined"] {
        let sim = Sim::new(32);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        let policy = policy.to_owned();
        sim.run(async move {
            let t = Tunables::with([("intent_log.policy", policy.as_str())]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
            store.create_volume("v", 16 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            let volume = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            const LEN: usize = 256 << 10;
            const PAIRS: u64 = 32;
            for i in 0..PAIRS {
                volume.write(i * LEN as u64, &vec![i as u8 + 1; LEN], false).await.unwrap();
                volume.flush().await.unwrap();
            }
            // The smoothed commit density reaches one per two changes after six pairs, so
            // at most 26 of the 32 writes can start early.
            let early = store.log_stats().early_commits.get();
            assert!(
                early >= 20,
                "{policy}: {early} early commits for {PAIRS} large write-flush pairs"
            );
            drop(volume);
            // The last early commit's task ends after the flush it served.
            for _ in 0..100 {
                if Arc::strong_count(&store) == 1 {
                    break;
                }
                env.sleep(Duration::from_millis(1)).await;
            }
            let Ok(store) = Arc::try_unwrap(store) else { panic!("a task still holds the store") };
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            for i in 0..PAIRS {
                let got = store.read("v", i * LEN as u64, LEN as u64).await.unwrap();
                assert!(got == vec![i as u8 + 1; LEN], "{policy}: write {i} after import");
            }
        })
        .unwrap();
    }
}

/// Resizes and destroys that arrive while a sync is in flight. The sync writes each volume's
/// tree at the levels of its quiesce and records it by name when it ends; a grow across a
/// level boundary inside it used to leave a root read with one level too many, and a destroy
/// (then a create under the same name) inside it freed the old tree twice and gave the new
/// volume the old one's blocks. They now wait for the sync. The audit balances and an import
/// reads every volume back.
#[test]
fn resize_and_destroy_during_a_sync() {
    let sim = Sim::new(101);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &tunables).await);
        // 64 blocks: one level; growing to 256 crosses to two.
        store.create_volume("grow", 64 * 4096, 4096).unwrap();
        store.create_volume("gone", 64 * 4096, 4096).unwrap();
        store.write("grow", 0, &[1; 64 * 4096]).await.unwrap();
        store.write("gone", 0, &[2; 64 * 4096]).await.unwrap();
        store.sync().await.unwrap();
        store.write("grow", 0, &[3; 64 * 4096]).await.unwrap();
        store.write("gone", 0, &[4; 64 * 4096]).await.unwrap();
        let syncing = Arc::clone(&store);
        let (done, finished) = futures::channel::oneshot::channel();
        env.spawn("sync", async move {
            let _ = done.send(syncing.sync().await.map(drop));
        });
        // Let the sync quiesce and start writing.
        env.sleep(Duration::from_micros(1)).await;
        store.resize_volume("grow", 256 * 4096).await.unwrap();
        store.destroy_volume("gone").await.unwrap();
        store.create_volume("gone", 64 * 4096, 4096).unwrap();
        finished.await.unwrap().unwrap();
        store.write("grow", 200 * 4096, &[5; 4096]).await.unwrap();
        store.sync().await.unwrap();
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        let check = |store: Arc<Store>| async move {
            assert_eq!(store.read("grow", 0, 64 * 4096).await.unwrap(), vec![3; 64 * 4096]);
            assert_eq!(store.read("grow", 200 * 4096, 4096).await.unwrap(), vec![5; 4096]);
            assert_eq!(store.read("gone", 0, 64 * 4096).await.unwrap(), vec![0; 64 * 4096]);
        };
        check(Arc::clone(&store)).await;
        Arc::try_unwrap(store).unwrap().export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = Arc::new(Store::open(pool, &tunables).await.unwrap());
        check(Arc::clone(&store)).await;
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}
