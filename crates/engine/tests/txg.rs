//! Crash-consistency swarm for the copy-on-write core (issue: pools and txgs). The other tests
//! of the txg layer are by mechanism: full_pool.rs, throttle.rs, dbuf.rs, volume.rs,
//! intent_log.rs, snapshot.rs, space.rs.
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
//! origin, and the audit (space, dedup references, dead lists) must balance. In half the seeds
//! the volume "big" is encrypted: each import loads its key (which checks every root MAC of
//! its family) before reading it, and its clones share the key. A failure prints the seed;
//! replay it with `SLUICE_SWARM_SEED=<seed> cargo test -p sluice-engine --test engine txg::`,
//! adding `SLUICE_SWARM_TRACE=1` to print each operation.

use crate::common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::sim::{CrashPolicy, Fault, SimImage};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::Pool;
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
/// The volume encrypted in the seeds [`encrypted`] picks, and its raw key.
const ENCRYPTED_VOLUME: usize = 0;
const KEY: [u8; 32] = [0x42; 32];

/// Whether seed `seed` encrypts [`ENCRYPTED_VOLUME`]: every other seed, crossing each layout.
fn encrypted(seed: u64) -> bool {
    seed % 2 == 1
}

/// Crash/import cycles of pools with an encrypted volume (a code probe).
static ENCRYPTED_CYCLES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Dedup work seen across the swarm (code probes: the test fails if there was none).
static DEDUP_SHARED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static DEDUP_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Crashes that cut a sync short (a code probe: the test fails if none happened).
static MID_SYNC_CRASHES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Blocks the stream reads handed to the open txg as scattered (dmu_rewrite.rs), over all seeds.
static REWRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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

/// Crash/import cycles of RAID-Z pools, and the states they opened (imports that found a
/// pool to check against the model).
static RAIDZ_CYCLES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The pool a seed runs on: a 2-way mirror, a raidz1 of 4 or a raidz2 of 6 (leaves, parity;
/// parity 0 is the mirror).
fn layout(seed: u64) -> (usize, u8) {
    match seed % 3 {
        0 => (2, 0),
        1 => (4, 1),
        _ => (6, 2),
    }
}

/// Runs one seed; returns the number of crash/import cycles.
fn run_seed(seed: u64, generations: u32) -> u32 {
    let mut rng = Rng::new(seed);
    let (leaves, parity) = layout(seed);
    let mut images = vec![SimImage::default(); leaves];
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
            // Every other generation caches no data, so reads go to the disks (and stream
            // reads may rewrite what they find scattered).
            let tunables = if generation % 2 == 1 {
                Tunables::with([("cache.contents", "metadata")]).unwrap()
            } else {
                Tunables::default()
            };
            let store = if generation == 0 {
                let spec = match parity {
                    0 => common::mirror_pool(d),
                    parity => sluice_engine::pool::PoolSpec {
                        name: "tank".into(),
                        ashift: 12,
                        top: vec![sluice_engine::pool::TopSpec::Raidz { parity, leaves: d }],
                    },
                };
                let pool = Pool::create(&e, spec, &tunables).await.unwrap();
                let store = Store::create(pool, &tunables);
                for (v, (name, size, block)) in VOLUMES.into_iter().enumerate() {
                    if v == ENCRYPTED_VOLUME && encrypted(seed) {
                        let key = sluice_engine::txg::NewKey {
                            format: sluice_format::KeyFormat::Raw,
                            location: sluice_format::KeyLocation::Prompt,
                            key: sluice_engine::UserKey::new(KEY.to_vec()),
                        };
                        store.create_encrypted_volume(name, size, block, false, key).await.unwrap();
                    } else {
                        store.create_volume(name, size, block).unwrap();
                    }
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
                if encrypted(seed) {
                    // Checks the MAC of every root of the family (volume, snapshots, clones).
                    let key = sluice_engine::UserKey::new(KEY.to_vec());
                    store.load_key(volume_name(ENCRYPTED_VOLUME), &key).await.unwrap_or_else(|e| {
                        panic!("seed {seed} generation {generation}: key load: {e}")
                    });
                }
                // The pool holds the last synced state, or the interrupted sync's if it landed.
                let found = found_contents(&store).await;
                {
                    let mut model = m.borrow_mut();
                    let landed = model.syncing.take();
                    if found != model.synced {
                        assert!(
                            landed.as_ref() == Some(&found),
                            "seed {seed} generation {generation}: imported contents match neither the last synced txg nor the interrupted one; replay with SLUICE_SWARM_SEED={seed} cargo test -p sluice-engine --test engine txg::crash_swarm"
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
                    7 => {
                        // A stream: part of the volume read in order, a few blocks a read, so
                        // the reads after the first continue a stream and may hand blocks they
                        // find scattered to the open txg (dmu_rewrite.rs).
                        // From a random 16 KiB unit (the largest block size here; a clone's
                        // is its origin's) for up to 2 MiB, in reads of 256 KiB: the volumes
                        // are sparse, and a read must find several of its blocks on disk.
                        let unit = 16384;
                        let units = size / unit;
                        let first = (offset / unit).min(units - 1);
                        let count = (16 + ops.below(113)).min(units - first);
                        let piece = 16 * unit;
                        let (start, end) = (first * unit, (first + count) * unit);
                        let (mut at, mut cut_short) = (start, false);
                        while at < end {
                            let n = piece.min(end - at);
                            let got = match store.read(name, at, n).await {
                                Ok(got) => got,
                                Err(_) if cut() => {
                                    cut_short = true;
                                    break;
                                }
                                Err(error) => panic!("seed {seed}: stream read failed: {error}"),
                            };
                            let model = m.borrow();
                            assert!(
                                got[..] == model.open.volumes[v][at as usize..(at + n) as usize],
                                "seed {seed}: stream read of {name} at {at} differs from what was written"
                            );
                            at += n;
                        }
                        if cut_short {
                            break;
                        }
                    }
                    6 => {
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
                            eprintln!("  -> {result:?} txg {}", store.pool().uberblock().txg);
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
            for v in 0..=VOLUMES.len() {
                if let Ok(stats) = store.volume_stats(volume_name(v)) {
                    let rewritten = stats.rewrite.blocks_rewritten.get();
                    REWRITTEN.fetch_add(rewritten, std::sync::atomic::Ordering::Relaxed);
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
    if parity > 0 {
        RAIDZ_CYCLES.fetch_add(generations - 1, std::sync::atomic::Ordering::Relaxed);
    }
    if encrypted(seed) {
        ENCRYPTED_CYCLES.fetch_add(generations - 1, std::sync::atomic::Ordering::Relaxed);
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
                     SLUICE_SWARM_SEED={seed} cargo test -p sluice-engine --test engine txg::crash_swarm"
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
    let raidz = RAIDZ_CYCLES.load(std::sync::atomic::Ordering::Relaxed);
    assert!(seeds < 3 || raidz * 2 >= cycles, "only {raidz} of {cycles} cycles on RAID-Z pools");
    let encrypted_cycles = ENCRYPTED_CYCLES.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        seeds < 2 || encrypted_cycles * 3 >= cycles,
        "only {encrypted_cycles} of {cycles} cycles with an encrypted volume"
    );
    let rewritten = REWRITTEN.load(std::sync::atomic::Ordering::Relaxed);
    assert!(seeds < 50 || rewritten > 0, "no stream read rewrote a scattered block");
    eprintln!(
        "crash swarm: {seeds} seeds, {cycles} crash/import cycles ({raidz} of them states of \
         raidz1-of-4 and raidz2-of-6 pools opened, {encrypted_cycles} of pools with an \
         encrypted volume, its key loaded and every root MAC checked), {mid_sync} during a \
         sync; dedup: {shared} blocks shared, {dropped} references dropped; {snapshot_ops} \
         snapshot changes, {clone_ops} clones made, promoted or destroyed; {rewritten} blocks \
         that stream reads found scattered rewritten; every import audited"
    );
}
