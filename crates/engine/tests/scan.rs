//! Leaves out of service and back, and the background scan (scrub and resilver) while the pool
//! keeps writing: an offline leaf gets no I/O, comes back through a resilver of only what it
//! missed, and then alone holds everything; a scrub interleaved with overwrites and syncs never
//! repairs onto reused space; pause, resume, stop and zpool's refusals.

use crate::common;

use std::sync::Arc;

use sluice_engine::alloc::log_region_bytes;
use sluice_engine::device::sim::{CrashPolicy, Fault, SimOptions};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::fm::EventClass;
use sluice_engine::pool::{Pool, PoolError, TopSpec};
use sluice_engine::rt::{Rng, Time};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{ScanFunc, ScanPhase, Store, StoreError};
use sluice_engine::vdev::{FaultReason, LeafState};
use sluice_format::{data_end_bytes, DATA_START_BYTES};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 4096;

/// The block cache off (reads must reach the legs) and chunks of 1 MiB, so a scan of the
/// 4 MiB volume takes several chunks with syncs between them; then `extra`.
fn tunables_with(extra: &[(&str, &str)]) -> Tunables {
    let mut all = vec![("cache.bytes_max", "0"), ("scan.chunk_bytes", "1M")];
    all.extend_from_slice(extra);
    Tunables::with(all).unwrap()
}

fn tunables() -> Tunables {
    tunables_with(&[])
}

/// A pool on two legs with one volume full of random data, synced.
fn setup(seed: u64) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    setup_with(seed, tunables())
}

fn setup_with(seed: u64, tunables: Tunables) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let store =
        common::store_with_volume(&sim, &legs, TopSpec::Mirror, &tunables, &data, BLOCK, |_| {});
    (sim, legs, store, data)
}

/// `pool offline -t`.
fn offline(sim: &Sim, store: &Arc<Store>, leaf: &str) -> Result<String, StoreError> {
    let s = Arc::clone(store);
    let leaf = leaf.to_owned();
    sim.run(async move { s.offline_leaf(&leaf, true).await }).unwrap().0
}

/// Exports the store and imports the pool again from the same legs, without serving it yet.
fn reimport(sim: &Sim, legs: &[SimDevice], store: Arc<Store>, tunables: Tunables) -> Arc<Store> {
    let store = Arc::try_unwrap(store).ok().unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    let env = sim.env();
    let specs = common::leaf_specs(legs);
    sim.run(async move {
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        Arc::new(Store::open(pool, &tunables).await.unwrap())
    })
    .unwrap()
    .0
}

/// What serving the store does first: the scan it opened with goes on, or a resilver starts
/// for a leaf behind; then waits until no scan works.
fn serve_scans(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    sim.run(async move {
        // A leaf behind for reasons a resilver's end does not see (one that went out of
        // service again during it) gets the next one.
        for _ in 0..3 {
            s.resume_scan();
            s.wait_scan().await;
        }
    })
    .unwrap();
}

fn leaf_stats(store: &Store, index: usize) -> (u64, u64, u64) {
    let leaves = store.pool().leaves();
    let stats = leaves[index].leaf.stats();
    (stats.reads.get(), stats.writes.get(), stats.flushes.get())
}

/// Takes leg1 offline, rewrites most of the volume while it is away (48 pieces of 64 KiB,
/// piece `i` filled with `fill + i`, kept in `data`), brings it back and stops its resilver
/// after the first chunk, as the server stopping does; returns the scan's status then.
fn halt_a_resilver_part_way(
    sim: &Sim,
    store: &Arc<Store>,
    data: &mut [u8],
    fill: u8,
) -> sluice_engine::txg::ScanStatus {
    offline(sim, store, "leg1").unwrap();
    let mut writes = Vec::new();
    for i in 0..48u64 {
        let at = i * (64 << 10);
        let bytes = vec![fill.wrapping_add(i as u8); 64 << 10];
        data[at as usize..][..bytes.len()].copy_from_slice(&bytes);
        writes.push((at, bytes));
    }
    let s = Arc::clone(store);
    sim.run(async move {
        for (at, bytes) in writes {
            s.write("v", at, &bytes).await.unwrap();
        }
        s.sync().await.unwrap();
        s.pool().online("leg1").unwrap();
        s.sync().await.unwrap();
        assert!(s.resilver_if_needed());
        while s.scan_status().unwrap().examined_bytes == 0 {
            s.pool().env().sleep(std::time::Duration::from_micros(100)).await;
        }
        s.halt_scan().await;
        s.scan_status().unwrap()
    })
    .unwrap()
    .0
}

/// An offline leg gets no I/O while the pool writes; the other leg cannot go offline then.
/// Online again, a background resilver copies the blocks born while it was away and no
/// others, after which it alone reads back every block, and the audit balances.
#[test]
fn offline_leaf_is_resilvered_with_only_what_it_missed() {
    let (sim, legs, store, mut data) = setup(3);
    assert_eq!(offline(&sim, &store, "leg1").unwrap(), "leg1");
    let refused = offline(&sim, &store, "leg0").unwrap_err();
    assert!(matches!(refused, StoreError::Pool(PoolError::NoValidReplicas { .. })), "{refused}");
    assert!(refused.to_string().contains("no valid replicas"), "{refused}");
    let unknown = offline(&sim, &store, "leg9").unwrap_err().to_string();
    assert!(unknown.contains("leg0, leg1"), "{unknown}");
    let before = leaf_stats(&store, 1);
    common::overwrite(&sim, &store, &mut data, 8, 0x40);
    assert_eq!(leaf_stats(&store, 1), before, "the offline leg was touched");
    assert_eq!(store.pool().leaves()[1].leaf.state(), LeafState::Offline);

    let s = Arc::clone(&store);
    let (path, resilvering) =
        sim.run(async move { s.online_leaf("leg1").await.unwrap() }).unwrap().0;
    assert_eq!(path, "leg1");
    assert!(resilvering, "the leg missed eight txgs");
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let status = store.scan_status().unwrap();
    assert_eq!((status.func, status.phase), (ScanFunc::Resilver, ScanPhase::Finished));
    assert_eq!(status.targets, vec![String::from("leg1")]);
    assert_eq!(status.unrecoverable, 0);
    assert!(status.repaired_copies >= 32, "the 8 x 4 new data blocks were copied: {status:?}");
    assert!(
        status.issued_blocks < VOLUME_BYTES / u64::from(BLOCK) / 4,
        "the resilver copied {} blocks of a {}-block volume",
        status.issued_blocks,
        VOLUME_BYTES / u64::from(BLOCK)
    );
    assert!(store.pool().leaves_behind().is_empty());

    // Leg0 gone: leg1 alone holds everything, and the accounting balances.
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let s = Arc::clone(&store);
    let audit = sim.run(async move { s.audit().await.unwrap() }).unwrap().0;
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// An offline that ends with the process (`-t`) still leaves the leg's uberblock rings at the
/// last txg it took: the next import finds it behind and resilvers it.
#[test]
fn a_leg_offline_at_export_is_resilvered_at_the_next_import() {
    let (sim, legs, store, mut data) = setup(4);
    offline(&sim, &store, "leg1").unwrap();
    common::overwrite(&sim, &store, &mut data, 4, 0x70);
    let store = Arc::try_unwrap(store).unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let (behind, store) = sim
        .run(async move {
            let tunables = tunables();
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let behind: Vec<String> = {
                let leaves = pool.leaves();
                let guids: Vec<u64> = pool.leaves_behind().iter().map(|b| b.0).collect();
                leaves.iter().filter(|l| guids.contains(&l.guid)).map(|l| l.path.clone()).collect()
            };
            (behind, Arc::new(Store::open(pool, &tunables).await.unwrap()))
        })
        .unwrap()
        .0;
    assert_eq!(behind, vec![String::from("leg1")]);
    serve_scans(&sim, &store);
    assert!(store.pool().leaves_behind().is_empty(), "serving resilvered it");
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// Write errors on one leg during a txg leave it behind; the resilver that follows the sync
/// copies what it missed. (The diagnosis is set not to fault the leg for them.)
#[test]
fn write_errors_on_a_leg_are_resilvered_after_the_sync() {
    let (sim, legs, store, mut data) =
        setup_with(5, tunables_with(&[("vdev.io_errors_max", "100000")]));
    legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 3, 0x11);
    legs[1].clear_faults();
    let behind = store.pool().leaves_behind();
    assert_eq!(behind.len(), 1, "leg1 missed writes");
    let s = Arc::clone(&store);
    sim.run(async move {
        assert!(s.resilver_if_needed());
        s.wait_scan().await;
    })
    .unwrap();
    let status = store.scan_status().unwrap();
    assert_eq!((status.func, status.phase), (ScanFunc::Resilver, ScanPhase::Finished));
    assert!(store.pool().leaves_behind().is_empty());
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// A scrub runs chunk by chunk while the volume is overwritten and synced between chunks: the
/// damaged copies it finds are repaired, no repair lands on space a later txg reused (every
/// block reads back as last written from either leg alone), and the audit balances.
#[test]
fn scrub_in_the_background_repairs_without_touching_reused_space() {
    let (sim, legs, store, mut data) = setup(6);
    // Every block of leg0's first 8 MiB of data damaged (the volume and the txgs after it).
    let start = DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES);
    let mut at = start;
    while at < start + (8 << 20) {
        legs[0].inject(Fault::BitFlip { offset_bytes: at + 100, bit: 3 });
        at += u64::from(BLOCK);
    }
    store.scrub_start().unwrap();
    // A second start while it runs is refused, naming the ways out.
    let again = store.scrub_start().unwrap_err().to_string();
    assert!(again.contains("already in progress") && again.contains("-p"), "{again}");
    // Overwrites and syncs while the scrub works (its chunks run between them).
    common::overwrite(&sim, &store, &mut data, 24, 0x90);
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let status = store.scan_status().unwrap();
    assert_eq!((status.func, status.phase), (ScanFunc::Scrub, ScanPhase::Finished));
    assert_eq!(status.unrecoverable, 0, "{status:?}");
    assert!(status.repaired_copies > 0, "{status:?}");
    assert_eq!(status.repaired_copies, status.errors, "{status:?}");
    // Leg0 alone, its read-time bit flips still armed: every block reads back as last
    // written, so every damaged copy the volume uses was rewritten (a write clears a flip).
    legs[1].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "leg0 alone");
    // Leg1 back (cleared: losing its device faulted it), then alone.
    legs[1].clear_faults();
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg1")).await.unwrap() }).unwrap();
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "leg1 alone");
    legs[0].clear_faults();
    let s = Arc::clone(&store);
    let audit = sim.run(async move { s.audit().await.unwrap() }).unwrap().0;
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// Pause, resume and stop, and zpool's refusals: nothing to pause or stop, a resilver
/// neither paused nor stopped, a scrub refused while a resilver runs.
#[test]
fn scrub_pause_resume_stop_and_refusals() {
    let (sim, _legs, store, _data) = setup(7);
    assert!(store.scrub_pause().unwrap_err().to_string().contains("no scrub in progress"));
    assert!(store.scrub_stop().unwrap_err().to_string().contains("no scrub in progress"));

    store.scrub_start().unwrap();
    store.scrub_pause().unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let paused = store.scan_status().unwrap();
    assert!(paused.phase == ScanPhase::Scanning && paused.paused, "{paused:?}");
    assert!(paused.progress() < 1.0);
    // Resume: it goes on from its bookmark to the end.
    store.scrub_start().unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let done = store.scan_status().unwrap();
    assert_eq!(done.phase, ScanPhase::Finished);
    assert!(done.issued_blocks >= VOLUME_BYTES / u64::from(BLOCK), "{done:?}");

    // Stop a paused scrub.
    store.scrub_start().unwrap();
    store.scrub_pause().unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    store.scrub_stop().unwrap();
    assert_eq!(store.scan_status().unwrap().phase, ScanPhase::Canceled);

    // A resilver: a scrub is refused meanwhile, and it cannot be paused or stopped.
    let mut data = vec![0u8; VOLUME_BYTES as usize];
    offline(&sim, &store, "leg1").unwrap();
    common::overwrite(&sim, &store, &mut data, 2, 1);
    let s = Arc::clone(&store);
    let refusals = sim
        .run(async move {
            s.pool().online("leg1").unwrap();
            s.sync().await.unwrap();
            assert!(s.resilver_if_needed());
            let refusals = [
                s.scrub_start().unwrap_err().to_string(),
                s.scrub_pause().unwrap_err().to_string(),
                s.scrub_stop().unwrap_err().to_string(),
            ];
            s.wait_scan().await;
            refusals
        })
        .unwrap()
        .0;
    assert!(refusals[0].contains("resilver is in progress"), "{}", refusals[0]);
    assert!(refusals[1].contains("cannot be paused"), "{}", refusals[1]);
    assert!(refusals[2].contains("cannot be stopped"), "{}", refusals[2]);
    assert_eq!(store.scan_status().unwrap().phase, ScanPhase::Finished);
}

/// Write errors across a whole leg fault it once `vdev.io_errors_max` of them pile up: the
/// pool keeps taking writes on the other leg and stops sending them to the faulted one.
/// Cleared once its device works, the leg is resilvered and alone holds everything.
#[test]
fn a_leg_failing_writes_is_faulted_then_cleared_and_resilvered() {
    let (sim, legs, store, mut data) = setup(8);
    legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 6, 0x21);
    let (state, errors_at_fault) = {
        let leaves = store.pool().leaves();
        (leaves[1].leaf.state(), leaves[1].leaf.stats().write_errors.get())
    };
    assert_eq!(state, LeafState::Faulted(FaultReason::TooManyErrors));
    common::overwrite(&sim, &store, &mut data, 4, 0x31);
    let leaves = store.pool().leaves();
    assert_eq!(leaves[1].leaf.stats().write_errors.get(), errors_at_fault, "written while faulted");
    assert_eq!(leaves[0].leaf.state(), LeafState::Online);
    drop(leaves);
    legs[1].clear_faults();
    let s = Arc::clone(&store);
    let (_, resilvering) =
        sim.run(async move { s.clear_leaves(Some("leg1")).await.unwrap() }).unwrap().0;
    assert!(resilvering);
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    assert!(store.pool().leaves_behind().is_empty());
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// Bad copies degrade a leg after `vdev.checksum_errors_max` of them (reads go to the other
/// leg from then on), whether reads or a scrub found them: a leg that returns garbage where
/// no client reads is degraded by the scrub that finds it (docs/design.md, "Fault
/// diagnosis"), and the pool's events say so. The leg with the only good copy is never taken
/// out, whatever it returns.
#[test]
fn checksum_errors_degrade_a_leg_but_never_the_last_good_copy() {
    // Round-robin reads, so that half of them meet leg1's bad copies. No prefetch: a read
    // of several blocks in one I/O counts one bad copy however many of its blocks are bad,
    // and these block-by-block reads count each (docs/design.md, "Sequential reads are
    // fetched ahead").
    let tunables = [("mirror.read_policy", "round-robin"), ("zfetch.max_distance", "0")];
    let (sim, legs, store, data) = setup_with(9, tunables_with(&tunables));
    let start = DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES);
    // Damage on leg0 that only a scrub reads.
    for block in 0..64u64 {
        legs[0].inject(Fault::BitFlip { offset_bytes: start + block * 4096 + 7, bit: 1 });
    }
    let seen = store.pool().events().list().last().map_or(0, |e| e.eid);
    store.scrub_start().unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    assert!(store.scan_status().unwrap().repaired_copies >= 64);
    assert_eq!(store.pool().leaves()[0].leaf.state(), LeafState::Degraded);
    assert_eq!(store.pool().leaves()[1].leaf.state(), LeafState::Online);
    let events: Vec<_> =
        store.pool().events().list().into_iter().filter(|e| e.eid > seen).collect();
    let classes: Vec<EventClass> = events.iter().map(|e| e.class).collect();
    assert_eq!(classes.first(), Some(&EventClass::ScrubStart), "{events:#?}");
    assert_eq!(classes.last(), Some(&EventClass::ScrubFinish), "{events:#?}");
    let degraded = events.iter().find(|e| e.class == EventClass::StateChange).unwrap();
    assert_eq!(degraded.vdev.as_deref(), Some("leg0"));
    assert_eq!(
        (degraded.detail("state"), degraded.detail("previous"), degraded.detail("reason")),
        (Some("DEGRADED"), Some("ONLINE"), Some("too many checksum errors"))
    );
    // The errors come as bursts: the first at once, the rest counted in later events and in
    // the leg's total.
    let bursts: Vec<_> = events.iter().filter(|e| e.class == EventClass::Checksum).collect();
    assert!(!bursts.is_empty() && bursts.len() < 64, "{bursts:#?}");
    assert!(bursts.iter().all(|e| e.vdev.as_deref() == Some("leg0")));
    assert_eq!(bursts[0].detail("errors"), Some("1"));
    let total = store.pool().leaves()[0].leaf.stats().checksum_errors.get();
    assert!(total >= 64, "{total}");
    // `pool clear` returns it to service, and says so.
    store.pool().clear(Some("leg0")).unwrap();
    assert_eq!(store.pool().leaves()[0].leaf.state(), LeafState::Online);
    let last: Vec<EventClass> =
        store.pool().events().list().iter().rev().take(2).map(|e| e.class).collect();
    assert_eq!(last, [EventClass::StateChange, EventClass::VdevClear]);
    // Reads that find leg1's copies bad degrade it.
    for block in 0..64u64 {
        legs[1].inject(Fault::BitFlip { offset_bytes: start + block * 4096 + 7, bit: 1 });
    }
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    assert_eq!(store.pool().leaves()[1].leaf.state(), LeafState::Degraded);
    // Leg1 out of service: leg0 holds the only good copies, and its read errors, however
    // many, leave it online (the reads fail instead).
    store.pool().leaves()[1].leaf.set_state(LeafState::Offline);
    legs[0].inject(Fault::ReadError { offset_bytes: start, len_bytes: 64 << 10 });
    let s = Arc::clone(&store);
    let failed = sim
        .run(async move {
            let mut failed = 0;
            for _ in 0..3 {
                for at in (0..64u64 << 10).step_by(4096) {
                    failed += u32::from(s.read("v", at, 4096).await.is_err());
                }
            }
            failed
        })
        .unwrap()
        .0;
    assert!(failed > 10, "{failed} reads failed");
    assert_eq!(store.pool().leaves()[0].leaf.state(), LeafState::Online);
}

/// An offline without `-t`, error counts and a fault by the diagnosis are in the pool
/// directory: after export and import the leg is still offline (and gets no I/O), the counts
/// are the same, and `online` brings it back through a resilver.
#[test]
fn leaf_states_and_error_counts_survive_export_and_import() {
    // Room for the write errors of one txg below the fault threshold (each sync writes
    // metadata in two copies), and six txgs of them above it.
    let (sim, legs, store, mut data) =
        setup_with(11, tunables_with(&[("vdev.io_errors_max", "40")]));
    // Some write errors on leg1, below the threshold: counted, then the leg goes offline.
    legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 1, 0x51);
    legs[1].clear_faults();
    let errors = store.pool().leaves()[1].leaf.errors();
    assert!(errors[1] > 0 && store.pool().leaves()[1].leaf.state() == LeafState::Online);
    let s = Arc::clone(&store);
    sim.run(async move { s.offline_leaf("leg1", false).await.unwrap() }).unwrap();
    common::overwrite(&sim, &store, &mut data, 3, 0x52);

    let store = reimport(&sim, &legs, store, tunables());
    let leaves = store.pool().leaves();
    assert_eq!(leaves[1].leaf.state(), LeafState::Offline, "the offline was kept");
    assert_eq!(leaves[1].leaf.errors(), errors, "the error counts were kept");
    assert_eq!(leaves[0].leaf.errors(), [0, 0, 0]);
    drop(leaves);
    let before = leaf_stats(&store, 1);
    serve_scans(&sim, &store);
    common::overwrite(&sim, &store, &mut data, 2, 0x53);
    assert_eq!(leaf_stats(&store, 1), before, "the offline leg was touched");

    // Online: resilvered; then the counts clear, and a clear is kept too.
    let s = Arc::clone(&store);
    sim.run(async move {
        s.online_leaf("leg1").await.unwrap();
        s.wait_scan().await;
        s.clear_leaves(None).await.unwrap();
    })
    .unwrap();
    assert!(store.pool().leaves_behind().is_empty());
    let store = reimport(&sim, &legs, store, tunables());
    assert_eq!(store.pool().leaves()[1].leaf.state(), LeafState::Online);
    assert_eq!(store.pool().leaves()[1].leaf.errors(), [0, 0, 0]);
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));

    // A leg faulted by the diagnosis stays faulted across an import, until cleared.
    legs[0].clear_faults();
    let store = {
        let s = Arc::clone(&store);
        sim.run(async move { s.clear_leaves(Some("leg0")).await.unwrap() }).unwrap();
        serve_scans(&sim, &store);
        store
    };
    legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
    common::overwrite(&sim, &store, &mut data, 6, 0x54);
    legs[1].clear_faults();
    assert_eq!(
        store.pool().leaves()[1].leaf.state(),
        LeafState::Faulted(FaultReason::TooManyErrors)
    );
    let store = reimport(&sim, &legs, store, tunables());
    assert_eq!(
        store.pool().leaves()[1].leaf.state(),
        LeafState::Faulted(FaultReason::TooManyErrors),
        "the fault was kept"
    );
}

/// A resilver stopped by an export after its first chunks goes on from its bookmark when the
/// pool is served again (its figures carry on from where they were), and then the leg alone
/// holds everything.
#[test]
fn a_resilver_interrupted_by_export_resumes_from_its_bookmark() {
    let (sim, legs, store, mut data) = setup(12);
    let halted = halt_a_resilver_part_way(&sim, &store, &mut data, 0x60);
    assert_eq!((halted.func, halted.phase), (ScanFunc::Resilver, ScanPhase::Scanning));
    assert!(halted.examined_bytes > 0 && halted.progress() < 1.0, "{halted:?}");

    let store = reimport(&sim, &legs, store, tunables());
    let resumed = store.scan_status().expect("the directory carried the scan");
    assert_eq!((resumed.func, resumed.phase), (ScanFunc::Resilver, ScanPhase::Scanning));
    assert_eq!(resumed.examined_bytes, halted.examined_bytes, "it goes on from its bookmark");
    assert_eq!(resumed.issued_blocks, halted.issued_blocks);
    assert_eq!(resumed.targets, vec![String::from("leg1")]);
    serve_scans(&sim, &store);
    let done = store.scan_status().unwrap();
    assert_eq!(
        (done.func, done.phase, done.unrecoverable),
        (ScanFunc::Resilver, ScanPhase::Finished, 0)
    );
    assert!(store.pool().leaves_behind().is_empty());
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// The moment a resumed resilver is reported finished, its leaf counts as holding every txg:
/// the other leg can go offline at once. (A resumed resilver holds only its range at its end;
/// it goes on with the txgs after it before it is called finished.)
#[test]
fn a_resumed_resilver_is_finished_only_when_its_leaf_holds_every_txg() {
    let (sim, legs, store, mut data) = setup(13);
    halt_a_resilver_part_way(&sim, &store, &mut data, 0x90);
    let store = reimport(&sim, &legs, store, tunables());
    let s = Arc::clone(&store);
    let (done, behind) = sim
        .run(async move {
            // Written while the resumed resilver runs: born after its range.
            s.write("v", 0, &[0xee; 4096]).await.unwrap();
            s.resume_scan();
            s.wait_scan().await;
            (s.scan_status().unwrap(), s.pool().leaves_behind())
        })
        .unwrap()
        .0;
    data[..4096].fill(0xee);
    assert_eq!(
        (done.func, done.phase, done.unrecoverable),
        (ScanFunc::Resilver, ScanPhase::Finished, 0)
    );
    assert!(behind.is_empty(), "finished, yet behind: {behind:?}");
    offline(&sim, &store, "leg0").expect("leg1 holds every txg once its resilver is done");
    // The events of the resumed resilver: one start (the pass after its range is part of it)
    // and its end.
    let classes: Vec<EventClass> = store.pool().events().list().iter().map(|e| e.class).collect();
    let count = |class| classes.iter().filter(|&&c| c == class).count();
    assert_eq!(count(EventClass::ResilverFinish), 1, "{classes:?}");
    assert_eq!(count(EventClass::ResilverStart), 0, "restored, not started: {classes:?}");
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// Power cuts at points spread over a resilver that runs while the pool syncs: after each
/// import the resilver goes on (from its bookmark when a sync had recorded one) and finishes,
/// and then each leg alone reads every block as written.
#[test]
fn power_cuts_during_a_resilver() {
    let seed = 21;
    let sim = Sim::new(seed);
    let options = SimOptions { store_data: true, record_log: true };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEG_BYTES, options);
    let specs = common::leaf_specs(&legs);
    let mut rng = Rng::new(seed);
    let mut data: Vec<u8> = (0..VOLUME_BYTES).map(|_| rng.u64() as u8).collect();
    let env = sim.env();
    let first = data.clone();
    let store = sim
        .run(async move {
            let store = common::mirror_store(&env, specs, &tunables()).await;
            store.create_volume("v", VOLUME_BYTES, BLOCK).unwrap();
            store.write("v", 0, &first).await.unwrap();
            store.sync().await.unwrap();
            Arc::new(store)
        })
        .unwrap()
        .0;
    offline(&sim, &store, "leg1").unwrap();
    let mut writes = Vec::new();
    for i in 0..48u64 {
        let at = i * (64 << 10);
        let bytes = vec![0x30 + i as u8; 64 << 10];
        data[at as usize..][..bytes.len()].copy_from_slice(&bytes);
        writes.push((at, bytes));
    }
    let s = Arc::clone(&store);
    let (start, end) = sim
        .run(async move {
            for (at, bytes) in writes {
                s.write("v", at, &bytes).await.unwrap();
            }
            s.sync().await.unwrap();
            s.pool().online("leg1").unwrap();
            let start = s.pool().env().now();
            s.sync().await.unwrap();
            assert!(s.resilver_if_needed());
            // Syncs go on while it runs, recording its bookmark.
            while s.scan_status().is_some_and(|st| st.phase == ScanPhase::Scanning) {
                s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                s.sync().await.unwrap();
            }
            (start, s.pool().env().now())
        })
        .unwrap()
        .0;
    assert!(store.pool().leaves_behind().is_empty());

    let cuts = 10u64;
    let mut resumed = 0;
    for k in 0..=cuts {
        let cut = Time::from_nanos(
            start.as_nanos() + (end.as_nanos() - start.as_nanos()) * k / cuts + rng.below(1000),
        );
        let images: Vec<_> = legs
            .iter()
            .map(|d| {
                let ops = d.write_log().iter().take_while(|e| e.at <= cut).count();
                d.crash_image(ops, CrashPolicy::Any, &mut rng).unwrap()
            })
            .collect();
        let after = Sim::new(seed + k);
        let revived = common::revive(&after, images, SimProfile::ssd(), LEG_BYTES);
        let env = after.env();
        let specs = common::leaf_specs(&revived);
        let store = after
            .run(async move {
                let tunables = tunables();
                let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
                Arc::new(Store::open(pool, &tunables).await.unwrap())
            })
            .unwrap()
            .0;
        let what = format!("seed {seed}, cut {k} of {cuts} at {cut:?}");
        if store.scan_status().is_some_and(|s| {
            s.func == ScanFunc::Resilver && s.phase == ScanPhase::Scanning && s.examined_bytes > 0
        }) {
            resumed += 1;
        }
        serve_scans(&after, &store);
        assert!(store.pool().leaves_behind().is_empty(), "{what}: a leg is still behind");
        revived[0].inject(Fault::Lost);
        assert_eq!(common::read_all(&after, &store, &data, BLOCK), (0, 0), "{what}: leg1 alone");
        revived[0].clear_faults();
        let s = Arc::clone(&store);
        after.run(async move { s.clear_leaves(Some("leg0")).await.unwrap() }).unwrap();
        serve_scans(&after, &store);
        revived[1].inject(Fault::Lost);
        assert_eq!(common::read_all(&after, &store, &data, BLOCK), (0, 0), "{what}: leg0 alone");
    }
    assert!(resumed > 0, "no cut fell where a sync had recorded the resilver's bookmark");
}

/// Reads every block of `name` (a volume or `VOL@SNAP`) against `expected`; returns (blocks
/// that failed, blocks that returned wrong bytes).
fn read_back(sim: &Sim, store: &Arc<Store>, name: &str, expected: &[u8]) -> (u64, u64) {
    let (s, name, expected) = (Arc::clone(store), name.to_owned(), expected.to_vec());
    sim.run(async move {
        let (mut failed, mut wrong) = (0, 0);
        for at in (0..expected.len() as u64).step_by(BLOCK as usize) {
            match s.read(&name, at, u64::from(BLOCK)).await {
                Ok(got) => wrong += u64::from(got != expected[at as usize..][..BLOCK as usize]),
                Err(_) => failed += 1,
            }
        }
        (failed, wrong)
    })
    .unwrap()
    .0
}

/// Blocks only snapshots hold (the volume overwrote them) are scrubbed and resilvered like
/// the volume's: a scrub repairs their damaged copies, and a leg that was offline while they
/// were written gets them from the resilver.
#[test]
fn scrub_and_resilver_reach_blocks_only_snapshots_hold() {
    let (sim, legs, store, mut data) = setup(12);
    let snapshot = |name: &str| {
        let (s, name) = (Arc::clone(&store), name.to_owned());
        sim.run(async move { s.create_snapshots(&[("v".to_owned(), name)], 0).await.unwrap() })
            .unwrap();
    };
    // The first snapshot holds the volume as set up; most of it is then overwritten.
    snapshot("first");
    let first = data.clone();
    common::overwrite(&sim, &store, &mut data, 200, 0x21);
    // Leg1 away while a second snapshot is taken between overwrites: what it holds alone was
    // born while leg1 missed it.
    assert_eq!(offline(&sim, &store, "leg1").unwrap(), "leg1");
    common::overwrite(&sim, &store, &mut data, 40, 0x52);
    snapshot("second");
    let second = data.clone();
    common::overwrite(&sim, &store, &mut data, 40, 0x73);
    let s = Arc::clone(&store);
    sim.run(async move { s.online_leaf("leg1").await.unwrap() }).unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let status = store.scan_status().unwrap();
    assert_eq!((status.func, status.unrecoverable), (ScanFunc::Resilver, 0), "{status:?}");
    // Leg1 alone reads both snapshots and the volume.
    legs[0].inject(Fault::Lost);
    for (name, expected) in [("v@first", &first), ("v@second", &second), ("v", &data)] {
        assert_eq!(read_back(&sim, &store, name, expected), (0, 0), "{name} from leg1 alone");
    }
    legs[0].clear_faults();
    let s = Arc::clone(&store);
    sim.run(async move { s.clear_leaves(Some("leg0")).await.unwrap() }).unwrap();
    // Every block of leg0's data area damaged; a scrub repairs what every tree holds.
    let start = DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES);
    for at in (start..data_end_bytes(LEG_BYTES)).step_by(BLOCK as usize) {
        legs[0].inject(Fault::BitFlip { offset_bytes: at + 100, bit: 5 });
    }
    store.scrub_start().unwrap();
    let s = Arc::clone(&store);
    sim.run(async move { s.wait_scan().await }).unwrap();
    let status = store.scan_status().unwrap();
    assert_eq!((status.func, status.unrecoverable), (ScanFunc::Scrub, 0), "{status:?}");
    assert!(status.repaired_copies > 0, "{status:?}");
    legs[1].inject(Fault::Lost);
    for (name, expected) in [("v@first", &first), ("v@second", &second), ("v", &data)] {
        assert_eq!(read_back(&sim, &store, name, expected), (0, 0), "{name} from leg0 alone");
    }
    legs[1].clear_faults();
    let s = Arc::clone(&store);
    let audit = sim.run(async move { s.audit().await.unwrap() }).unwrap().0;
    assert!(audit.is_clean(), "{:?}", audit.problems);
}
