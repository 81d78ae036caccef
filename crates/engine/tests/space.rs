//! A pool that runs short of space while it serves and is administered never suspends, and a
//! thick volume is never refused a write (ZFS: `refreservation`, `spa_slop_shift`).
//!
//! The swarm: a small mirror, a thick volume written at random by several clients that flush
//! now and then, a thin deduplicated volume written until the pool refuses it, and beside them
//! a loop of what an administrator does: snapshots of the thick volume sent incrementally to
//! another pool, the older snapshot destroyed, a clone of the newest written to and destroyed,
//! and in turn a scrub, a leg taken offline and back (a resilver), a grow of the thin volume,
//! and a scratch volume written, snapshotted, rolled back and destroyed. At the end every
//! acknowledged write reads back, the replica's newest snapshot equals the source's, the audit
//! balances, and no sync allocated more than admission counted for it (checked for every
//! sync as the run goes).

use crate::common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use sluice_engine::device::SimProfile;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{ReceiveMode, Store, StoreError};
use sluice_engine::ErrorKind;
use sluice_format::{StreamReader, StreamWriter};
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const REPLICA_LEG_BYTES: u64 = 96 << 20;
const THICK_BYTES: u64 = 8 << 20;
const THIN_BYTES: u64 = 24 << 20;
/// More than the pool holds: the thin volume fills it.
const THIN_BYTES_MAX: u64 = 48 << 20;
const BLOCK: u32 = 16384;
const WRITE: usize = 4096;
const WRITERS: u64 = 4;

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.u64() as u8).collect()
}

async fn send(store: &Store, snapshot: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    {
        let mut emit = |record| writer.write(&record);
        store.send_snapshot("thick", snapshot, from, &mut emit).await.unwrap();
    }
    writer.finish().unwrap();
    out
}

async fn receive(store: &Store, stream: &[u8]) -> Result<(), StoreError> {
    let mut reader = StreamReader::new(stream);
    let mut next = || reader.next_record();
    store.receive("replica", ReceiveMode::Whole, &mut next).await.map(|_| ())
}

/// An administrative command's answer: done, or refused for lack of space with a message that
/// names the pool. Anything else fails the test.
fn refused_for_space(what: &str, result: Result<(), StoreError>) -> bool {
    match result {
        Ok(()) => false,
        Err(error) if error.kind() == ErrorKind::NoSpace => {
            let said = error.to_string();
            assert!(said.contains("tank"), "{what}: the refusal names no pool: {said}");
            assert!(
                ["free", "destroy", "trim"].iter().any(|w| said.contains(w)),
                "{what}: the refusal says nothing of what to do: {said}"
            );
            true
        }
        Err(error) => panic!("{what}: {error}"),
    }
}

/// Checks the syncs `store` recorded after txg `after`: none allocated more than admission
/// counted for it. Returns the newest txg checked and the highest share of its count a sync
/// used, in percent.
fn check_syncs(seed: u64, store: &Store, after: u64) -> (u64, u64) {
    let (mut newest, mut most) = (after, 0);
    for record in store.sync_history().into_iter().filter(|r| r.txg > after) {
        assert!(
            record.allocated_bytes <= record.admitted_bytes,
            "seed {seed}: txg {} allocated {} bytes, admission counted {}",
            record.txg,
            record.allocated_bytes,
            record.admitted_bytes
        );
        newest = record.txg;
        most = most.max(record.allocated_bytes * 100 / record.admitted_bytes.max(1));
    }
    (newest, most)
}

/// A thin volume "r" written, snapshotted, written again, rolled back to the snapshot (which
/// it then reads as), and destroyed with its snapshot; any step may be refused for space.
async fn scratch(store: &Store, rng: &mut Rng) {
    const BYTES: u64 = 4 << 20;
    store.create_volume("r", BYTES, BLOCK).unwrap();
    let first = random(rng, (BYTES / 2) as usize);
    let wrote = store.write("r", 0, &first).await.map(drop);
    if !refused_for_space("scratch write", wrote) {
        let made = store.create_snapshots(&[("r".into(), "x".into())], 0).await.map(drop);
        if !refused_for_space("scratch snapshot", made) {
            let again = store.write("r", BYTES / 4, &random(rng, (BYTES / 2) as usize)).await;
            let _ = refused_for_space("scratch overwrite", again.map(drop));
            let back = store.rollback_volume("r", "x", false).await;
            if !refused_for_space("scratch rollback", back) {
                let got = store.read("r", 0, BYTES / 2).await.unwrap();
                assert!(got == first, "the rolled back volume does not read as its snapshot");
            }
        }
    }
    store.destroy_volume_with("r", true).await.unwrap();
}

/// What one seed's run saw.
#[derive(Debug, Default)]
struct Seen {
    thick_writes: u64,
    thin_refusals: u64,
    admin_refusals: u64,
    snapshots_sent: u64,
    scrubs: u64,
    resilvers: u64,
    syncs_checked: u64,
    /// The highest share of admission's count a sync allocated, in percent.
    most_allocated_pct: u64,
}

/// One seed: `rounds` administrative rounds of about a simulated second each.
fn run_seed(seed: u64, rounds: u64) -> Seen {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let replica_legs = common::legs(&sim, 2, SimProfile::ssd(), REPLICA_LEG_BYTES);
    let env = sim.env();
    let main = async move {
        let tunables = Tunables::with([("txg.timeout_ms", "1000")]).unwrap();
        let store =
            Arc::new(common::mirror_store(&env, common::leaf_specs(&legs), &tunables).await);
        let replica =
            Rc::new(common::mirror_store(&env, common::leaf_specs(&replica_legs), &tunables).await);
        store.create_volume_with("thick", THICK_BYTES, BLOCK, true).unwrap();
        store.create_volume("thin", THIN_BYTES, BLOCK).unwrap();
        // The thin volume deduplicates: the table's rewrites run short of space too.
        store.set_dedup("thin", sluice_format::DedupMode::On).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        // The thick volume as acknowledged; each writer owns the 4 KiB pieces `piece % WRITERS`.
        let thick = Rc::new(RefCell::new(vec![0u8; THICK_BYTES as usize]));
        let stop = Rc::new(Cell::new(false));
        let seen = Rc::new(RefCell::new(Seen::default()));
        let writer = |w: u64| {
            let (store, env, thick, stop, seen) = (
                Arc::clone(&store),
                env.clone(),
                Rc::clone(&thick),
                Rc::clone(&stop),
                Rc::clone(&seen),
            );
            async move {
                let mut rng = Rng::new(seed * 1000 + w);
                let pieces = THICK_BYTES / WRITE as u64 / WRITERS;
                let mut since_flush = 0;
                while !stop.get() {
                    let at = (rng.below(pieces) * WRITERS + w) * WRITE as u64;
                    let data = random(&mut rng, WRITE);
                    if let Err(error) = store.write("thick", at, &data).await {
                        panic!("seed {seed}: writer {w}: thick write at {at} refused: {error}");
                    }
                    thick.borrow_mut()[at as usize..][..WRITE].copy_from_slice(&data);
                    seen.borrow_mut().thick_writes += 1;
                    since_flush += 1;
                    if since_flush == 8 {
                        since_flush = 0;
                        if let Err(error) = store.flush("thick").await {
                            panic!("seed {seed}: writer {w}: flush of thick failed: {error}");
                        }
                    }
                    env.sleep(std::time::Duration::from_micros(2000 + rng.below(10000))).await;
                }
            }
        };
        let thin_writer = {
            let (store, env, stop, seen) =
                (Arc::clone(&store), env.clone(), Rc::clone(&stop), Rc::clone(&seen));
            async move {
                let mut rng = Rng::new(seed * 1000 + 999);
                while !stop.get() {
                    let size = store.volume_info("thin").unwrap().size_bytes;
                    let at = rng.below(size / 65536) * 65536;
                    let data = random(&mut rng, 65536);
                    match store.write("thin", at, &data).await {
                        Ok(_) => {}
                        Err(error) if error.kind() == ErrorKind::NoSpace => {
                            let said = error.to_string();
                            assert!(
                                said.contains("pool tank") && said.contains("volume thin"),
                                "{said}"
                            );
                            seen.borrow_mut().thin_refusals += 1;
                        }
                        Err(error) => panic!("seed {seed}: thin write: {error}"),
                    }
                    env.sleep(std::time::Duration::from_millis(4 + rng.below(12))).await;
                }
            }
        };
        let admin =
            {
                let (store, env, stop, seen, replica) = (
                    Arc::clone(&store),
                    env.clone(),
                    Rc::clone(&stop),
                    Rc::clone(&seen),
                    Rc::clone(&replica),
                );
                async move {
                    let mut rng = Rng::new(seed * 1000 + 7);
                    let mut sent: Option<String> = None;
                    for round in 0..rounds {
                        env.sleep(std::time::Duration::from_millis(500 + rng.below(1000))).await;
                        let name = format!("s{round}");
                        let made =
                            store.create_snapshots(&[("thick".into(), name.clone())], round).await;
                        if refused_for_space("snapshot create", made.map(drop)) {
                            seen.borrow_mut().admin_refusals += 1;
                            // What an administrator told so does: trims part of the thin volume.
                            let size = store.volume_info("thin").unwrap().size_bytes;
                            let len = 1 << 20;
                            let at = rng.below((size - len) / 65536 + 1) * 65536;
                            store.zero("thin", at, len).await.unwrap_or_else(|e| {
                                panic!("seed {seed}: trim of thin failed: {e}")
                            });
                        } else {
                            // Sent to the replica, incrementally after the first.
                            let stream = send(&store, &name, sent.as_deref()).await;
                            receive(&replica, &stream)
                                .await
                                .unwrap_or_else(|e| panic!("seed {seed}: receive of {name}: {e}"));
                            seen.borrow_mut().snapshots_sent += 1;
                            if let Some(older) = sent.replace(name.clone()) {
                                replica.destroy_snapshot("replica", &older).await.unwrap_or_else(
                                    |e| panic!("seed {seed}: destroy of replica@{older}: {e}"),
                                );
                                store.destroy_snapshot("thick", &older).await.unwrap_or_else(|e| {
                                    panic!("seed {seed}: destroy of thick@{older}: {e}")
                                });
                            }
                            // A clone of the newest, written to, then destroyed.
                            let cloned = store.clone_snapshot("thick", &name, "c").await;
                            if !refused_for_space("clone", cloned) {
                                let data = random(&mut rng, 65536);
                                let at = rng.below(THICK_BYTES / 65536) * 65536;
                                let wrote = store.write("c", at, &data).await.map(drop);
                                if refused_for_space("clone write", wrote) {
                                    seen.borrow_mut().admin_refusals += 1;
                                }
                                store.destroy_volume("c").await.unwrap_or_else(|e| {
                                    panic!("seed {seed}: destroy of clone c: {e}")
                                });
                            } else {
                                seen.borrow_mut().admin_refusals += 1;
                            }
                        }
                        match round % 4 {
                            0 => match store.scrub_start() {
                                Ok(()) => seen.borrow_mut().scrubs += 1,
                                // A scan already running.
                                Err(StoreError::ScanRefused { .. }) => {}
                                Err(error) => panic!("seed {seed}: scrub: {error}"),
                            },
                            1 => {
                                store.offline_leaf("leg1", true).await.unwrap();
                                env.sleep(std::time::Duration::from_millis(300)).await;
                                let (_, resilvering) = store.online_leaf("leg1").await.unwrap();
                                seen.borrow_mut().resilvers += u64::from(resilvering);
                            }
                            2 => {
                                let size = store.volume_info("thin").unwrap().size_bytes;
                                if size < THIN_BYTES_MAX {
                                    let grown = store.resize_volume("thin", size + (2 << 20)).await;
                                    if refused_for_space("thin grow", grown) {
                                        seen.borrow_mut().admin_refusals += 1;
                                    }
                                }
                            }
                            _ => {
                                // A volume written, snapshotted, written again, rolled back
                                // and destroyed with its snapshot: the syncs that free it.
                                scratch(&store, &mut rng).await;
                                store.sync().await.unwrap();
                            }
                        }
                        assert!(!store.is_suspended(), "seed {seed}: suspended in round {round}");
                    }
                    stop.set(true);
                    sent
                }
            };
        // Every sync's record is checked, often enough that none leaves the history unseen.
        let auditor = {
            let (store, env, stop, seen) =
                (Arc::clone(&store), env.clone(), Rc::clone(&stop), Rc::clone(&seen));
            async move {
                let mut checked = store.sync_history().last().map_or(0, |r| r.txg);
                while !stop.get() {
                    env.sleep(std::time::Duration::from_millis(20)).await;
                    let oldest = store.sync_history().first().map_or(0, |r| r.txg);
                    assert!(oldest <= checked + 1, "seed {seed}: syncs after {checked} unseen");
                    let (newest, most) = check_syncs(seed, &store, checked);
                    let mut seen = seen.borrow_mut();
                    seen.syncs_checked += newest - checked;
                    seen.most_allocated_pct = seen.most_allocated_pct.max(most);
                    checked = newest;
                }
            }
        };
        let ((), (), (), (), (), (), sent) =
            futures::join!(auditor, writer(0), writer(1), writer(2), writer(3), thin_writer, admin);
        store.wait_scan().await;
        store.sync().await.unwrap();
        assert!(!store.is_suspended(), "seed {seed}: suspended");
        // Every acknowledged write reads back.
        let expected = thick.borrow().clone();
        let got = store.read("thick", 0, THICK_BYTES).await.unwrap();
        assert!(got == expected, "seed {seed}: the thick volume does not read back as written");
        // The replica's newest snapshot is the source's.
        if let Some(last) = sent {
            let ours = store.read(&format!("thick@{last}"), 0, THICK_BYTES).await.unwrap();
            let theirs = replica.read(&format!("replica@{last}"), 0, THICK_BYTES).await.unwrap();
            assert!(ours == theirs, "seed {seed}: the replica's {last} differs");
        }
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "seed {seed}: audit: {:?}", audit.problems);
        check_syncs(seed, &store, 0);
        Rc::try_unwrap(seen).unwrap().into_inner()
    };
    match sim.run(main) {
        Ok((seen, _)) => seen,
        Err(error) => panic!("seed {seed}: {error}"),
    }
}

#[test]
fn a_full_pool_serves_and_is_administered_without_suspending() {
    if let Some(seed) = std::env::var("SLUICE_SPACE_SEED").ok().and_then(|s| s.parse().ok()) {
        eprintln!("{:?}", run_seed(seed, 60));
        return;
    }
    // Six seeds fit CI: a seed takes 25-29 s of one core in the test profile on a slow VM
    // (2026-12-01), where sixteen ran past nextest's 300 s limit. Longer swarms set the count.
    let seeds: u64 =
        std::env::var("SLUICE_SPACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(6);
    let mut total = Seen::default();
    for seed in 0..seeds {
        let seen = std::panic::catch_unwind(|| run_seed(seed, 60)).unwrap_or_else(|panic| {
            eprintln!(
                "the space swarm failed at seed {seed}; replay it alone with \
                 SLUICE_SPACE_SEED={seed} cargo test -p sluice-engine --test engine space::"
            );
            std::panic::resume_unwind(panic)
        });
        total.thick_writes += seen.thick_writes;
        total.thin_refusals += seen.thin_refusals;
        total.admin_refusals += seen.admin_refusals;
        total.snapshots_sent += seen.snapshots_sent;
        total.scrubs += seen.scrubs;
        total.resilvers += seen.resilvers;
        total.syncs_checked += seen.syncs_checked;
        total.most_allocated_pct = total.most_allocated_pct.max(seen.most_allocated_pct);
    }
    eprintln!("{total:?}");
    // The swarm did what it is for: the pool ran short (thin writes and administrative
    // commands were refused), and snapshots went to the replica beside scrubs and resilvers.
    assert!(total.thin_refusals > 0 && total.admin_refusals > 0, "{total:?}");
    assert!(total.snapshots_sent > seeds && total.scrubs > 0 && total.resilvers > 0, "{total:?}");
    assert!(total.syncs_checked > 100 * seeds, "{total:?}");
}
