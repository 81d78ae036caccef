//! Send and receive between two pools: a full stream makes the volume and its snapshot
//! byte for byte; an incremental one carries only what changed and adds the newer snapshot; a
//! stream cut short or damaged is refused naming the record and leaves nothing visible; a
//! resumable receive interrupted keeps what arrived, across an export and import, and resumes
//! from its token to the same bytes; a stream from a newer sluice is refused saying so; the
//! audit balances on both pools.

use crate::common;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{ReceiveMode, Store, StoreError};
use sluice_format::{ResumeToken, StreamReader, StreamWriter};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK: u64 = 16384;

async fn send(store: &Store, snapshot: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    let summary = {
        let mut emit = |record| writer.write(&record);
        store.send_snapshot("v", snapshot, from, &mut emit).await.unwrap()
    };
    let (records, _) = writer.finish().unwrap();
    assert_eq!(records, summary.records);
    out
}

async fn receive(store: &Store, target: &str, stream: &[u8]) -> Result<(), StoreError> {
    let mut reader = StreamReader::new(stream);
    let mut next = || reader.next_record();
    store.receive(target, ReceiveMode::Whole, &mut next).await.map(|_| ())
}

async fn receive_resumable(store: &Store, target: &str, stream: &[u8]) -> Result<(), StoreError> {
    let mut reader = StreamReader::new(stream);
    let mut next = || reader.next_record();
    store.receive(target, ReceiveMode::Resumable, &mut next).await.map(|_| ())
}

async fn send_resume(store: &Store, token: &ResumeToken) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    {
        let mut emit = |record| writer.write(&record);
        store.send_resume(token, &mut emit).await.unwrap();
    }
    writer.finish().unwrap();
    out
}

/// The token an interruption reported, checked against the one the pool lists.
fn token_of(store: &Store, target: &str, error: &StoreError) -> ResumeToken {
    let StoreError::ReceiveInterrupted { token, .. } = error else {
        panic!("not an interrupted receive: {error}")
    };
    let listed = store.interrupted_receives();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, target);
    assert_eq!(&listed[0].1.encode(), token);
    ResumeToken::decode(token).unwrap()
}

async fn audit_clean(store: &Store, step: &str) {
    let report = store.audit().await.unwrap();
    assert!(report.is_clean(), "audit after {step}: {:?}", report.problems);
}

#[test]
fn full_and_incremental_streams_replicate_snapshots() {
    let sim = Sim::new(31);
    let a_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let b_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    sim.run(async move {
        let tunables = Tunables::default();
        let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &tunables).await;
        let b = common::mirror_store(&env, common::leaf_specs(&b_legs), &tunables).await;
        let mut rng = Rng::new(3);
        a.create_volume("v", VOLUME_BYTES, BLOCK as u32).unwrap();
        // Half compressible (sent compressed), half random, a hole in between.
        let mut data = vec![0u8; VOLUME_BYTES as usize];
        for (i, chunk) in data.chunks_mut(BLOCK as usize).enumerate() {
            match i % 4 {
                0 => chunk.fill(i as u8),
                1 | 2 => chunk.iter_mut().for_each(|b| *b = rng.u64() as u8),
                _ => {}
            }
        }
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            if i % 4 != 3 {
                a.write("v", i as u64 * BLOCK, chunk).await.unwrap();
            }
        }
        a.create_snapshots(&[("v".into(), "one".into())], 100).await.unwrap();
        let full = send(&a, "one", None).await;
        receive(&b, "w", &full).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        assert!(b.read("w@one", 0, VOLUME_BYTES).await.unwrap() == data);
        let got = b.snapshots("w").unwrap();
        assert_eq!((got[0].name.as_str(), got[0].creation_secs), ("one", 100));
        let first = data.clone();
        assert!(b.volumes().iter().all(|v| !v.name.starts_with('%')));
        // Ten blocks change, one is trimmed: the incremental stream carries those.
        for i in 0..10u64 {
            let block: Vec<u8> = (0..BLOCK).map(|_| rng.u64() as u8).collect();
            let at = (i * 37 % 256) * BLOCK;
            a.write("v", at, &block).await.unwrap();
            data[at as usize..][..BLOCK as usize].copy_from_slice(&block);
        }
        a.zero("v", BLOCK, BLOCK).await.unwrap();
        data[BLOCK as usize..][..BLOCK as usize].fill(0);
        a.create_snapshots(&[("v".into(), "two".into())], 200).await.unwrap();
        let incremental = send(&a, "two", Some("one")).await;
        assert!(
            incremental.len() * 10 < full.len(),
            "incremental {} bytes, full {}",
            incremental.len(),
            full.len()
        );
        // Cut short, or damaged: refused, naming what went wrong; w stays as it was.
        let cut = receive(&b, "w", &incremental[..incremental.len() / 2]).await.unwrap_err();
        assert!(cut.to_string().contains("cut short"), "{cut}");
        let mut damaged = incremental.clone();
        let at = damaged.len() / 3;
        damaged[at] ^= 0x40;
        let refused = receive(&b, "w", &damaged).await.unwrap_err();
        assert!(refused.to_string().contains("record"), "{refused}");
        assert!(b.volumes().iter().all(|v| !v.name.starts_with('%')));
        assert_eq!(b.snapshots("w").unwrap().len(), 1);
        audit_clean(&b, "refused streams").await;
        // Whole, it applies.
        receive(&b, "w", &incremental).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        let got = b.snapshots("w").unwrap();
        assert_eq!(got.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        assert!(b.read("w@one", 0, VOLUME_BYTES).await.unwrap() == first);
        assert!(b.read("w@two", 0, VOLUME_BYTES).await.unwrap() == data);
        // Sent again, it is refused: w's newest snapshot is no longer the stream's older one.
        assert!(matches!(
            receive(&b, "w", &incremental).await,
            Err(StoreError::ReceiveRefused { .. })
        ));
        // A full stream into an existing volume is refused too.
        assert!(matches!(receive(&b, "w", &full).await, Err(StoreError::ReceiveRefused { .. })));
        // A stream from a newer sluice (its begin record says version 3, checksum made good)
        // is refused saying so, and nothing of it is kept.
        let mut newer = full.clone();
        let payload = u32::from_le_bytes(newer[16..20].try_into().unwrap()) as usize;
        newer[24 + 8] = 3;
        let sum = sluice_format::ChecksumAlg::Xxh3_128.compute(&newer[..24 + payload]);
        newer[24 + payload..24 + payload + 16].copy_from_slice(&sum.0);
        let error = receive(&b, "fresh", &newer).await.unwrap_err();
        assert!(error.to_string().contains("newer sluice"), "{error}");
        assert!(b.volume_info("fresh").is_none() && b.interrupted_receives().is_empty());
        audit_clean(&a, "sends").await;
        audit_clean(&b, "receives").await;
        b.export().await.unwrap();
        let pool =
            Pool::import(&env, common::leaf_specs(&b_legs), "tank", &tunables).await.unwrap();
        let b = Store::open(pool, &tunables).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        audit_clean(&b, "import").await;
    })
    .unwrap();
}

#[test]
fn interrupted_receives_resume_from_their_token() {
    let sim = Sim::new(32);
    let a_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let b_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    sim.run(async move {
        let tunables = Tunables::default();
        let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &tunables).await;
        let mut b = common::mirror_store(&env, common::leaf_specs(&b_legs), &tunables).await;
        let mut rng = Rng::new(4);
        a.create_volume("v", VOLUME_BYTES, BLOCK as u32).unwrap();
        let mut data: Vec<u8> = (0..VOLUME_BYTES).map(|_| rng.u64() as u8).collect();
        a.write("v", 0, &data).await.unwrap();
        a.create_snapshots(&[("v".into(), "one".into())], 100).await.unwrap();
        let full = send(&a, "one", None).await;

        // Cut at 40%: the target does not exist, nor can a client open what arrived; the
        // token says where it stopped.
        let error = receive_resumable(&b, "w", &full[..full.len() * 2 / 5]).await.unwrap_err();
        assert!(error.to_string().contains("a send from its resume token"), "{error}");
        let token = token_of(&b, "w", &error);
        assert!(token.next_block > 0 && token.next_block < VOLUME_BYTES / BLOCK, "{token:?}");
        assert!(b.volumes().is_empty());
        assert!(b.read("w", 0, BLOCK).await.is_err());
        assert!(b.export_dataset("%recv-w").is_err());
        // The whole stream again is refused while the kept one waits; so is a resume that
        // starts elsewhere.
        let again = receive(&b, "w", &full).await.unwrap_err();
        assert!(again.to_string().contains("or abort it"), "{again}");
        let early = ResumeToken { next_block: token.next_block - 1, ..token.clone() };
        let wrong = receive(&b, "w", &send_resume(&a, &early).await).await.unwrap_err();
        assert!(wrong.to_string().contains("stopped at block"), "{wrong}");
        audit_clean(&b, "an interrupted receive").await;

        // It survives an export and import; damaged on resume, it keeps going.
        b.export().await.unwrap();
        let pool =
            Pool::import(&env, common::leaf_specs(&b_legs), "tank", &tunables).await.unwrap();
        b = Store::open(pool, &tunables).await.unwrap();
        assert_eq!(b.interrupted_receives()[0].1, token);
        let mut rest = send_resume(&a, &token).await;
        assert!(rest.len() < full.len() * 7 / 10, "resumed {} of {}", rest.len(), full.len());
        let at = rest.len() / 2;
        rest[at] ^= 1;
        let error = receive(&b, "w", &rest).await.unwrap_err();
        let later = token_of(&b, "w", &error);
        assert!(later.next_block > token.next_block, "{later:?} after {token:?}");
        receive(&b, "w", &send_resume(&a, &later).await).await.unwrap();
        assert!(b.interrupted_receives().is_empty());
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        assert!(b.read("w@one", 0, VOLUME_BYTES).await.unwrap() == data);

        // An incremental one: interrupted, then the target is written, so resuming would
        // lose that write: refused; rolled back, it resumes.
        for i in (0..VOLUME_BYTES / BLOCK).step_by(5) {
            let block: Vec<u8> = (0..BLOCK).map(|_| rng.u64() as u8).collect();
            a.write("v", i * BLOCK, &block).await.unwrap();
            data[(i * BLOCK) as usize..][..BLOCK as usize].copy_from_slice(&block);
        }
        a.create_snapshots(&[("v".into(), "two".into())], 200).await.unwrap();
        let incremental = send(&a, "two", Some("one")).await;
        let error =
            receive_resumable(&b, "w", &incremental[..incremental.len() / 2]).await.unwrap_err();
        let token = token_of(&b, "w", &error);
        assert_eq!(b.snapshots("w").unwrap().len(), 1);
        b.write("w", 0, &[7u8; BLOCK as usize]).await.unwrap();
        let changed = receive(&b, "w", &send_resume(&a, &token).await).await.unwrap_err();
        assert!(changed.to_string().contains("roll it back"), "{changed}");
        b.rollback_volume("w", "one", false).await.unwrap();
        receive(&b, "w", &send_resume(&a, &token).await).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        let names: Vec<String> = b.snapshots("w").unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["one", "two"]);

        // Dropped instead: nothing of it stays.
        a.write("v", 0, &[9u8; BLOCK as usize]).await.unwrap();
        a.create_snapshots(&[("v".into(), "three".into())], 300).await.unwrap();
        let third = send(&a, "three", Some("two")).await;
        receive_resumable(&b, "w", &third[..third.len() - 20]).await.unwrap_err();
        assert_eq!(b.interrupted_receives().len(), 1);
        b.abort_receive("w").await.unwrap();
        assert!(b.interrupted_receives().is_empty());
        assert!(b.abort_receive("w").await.is_err());
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        audit_clean(&a, "sends").await;
        audit_clean(&b, "resumed receives").await;
    })
    .unwrap();
}

/// Power is cut at a random moment of an incremental receive, whole or resumable, the finish
/// steps included (snapshot, promote, destroy, rename: several txgs). After import the target
/// is either as it was or has the new snapshot, never in between, nothing hidden is listed,
/// and the audit balances; a resumable one that kept a token resumes to the new snapshot.
#[test]
fn receives_survive_power_cuts() {
    use sluice_engine::device::sim::{CrashPolicy, Fault, SimImage};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    const LEG_BYTES: u64 = 64 << 20;
    let tunables = Tunables::default();
    // World 0: pool a with v@one and v@two, pool b with w@one received; the streams.
    let sim = Sim::new(40);
    let a_legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let b_legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let (env, t) = (sim.env(), tunables.clone());
    let (al, bl) = (a_legs.clone(), b_legs.clone());
    let ((one, two, incremental), _) = sim
        .run(async move {
            let a = common::mirror_store(&env, common::leaf_specs(&al), &t).await;
            let b = common::mirror_store(&env, common::leaf_specs(&bl), &t).await;
            let mut rng = Rng::new(5);
            a.create_volume("v", VOLUME_BYTES, BLOCK as u32).unwrap();
            let one: Vec<u8> = (0..VOLUME_BYTES).map(|_| rng.u64() as u8).collect();
            a.write("v", 0, &one).await.unwrap();
            a.create_snapshots(&[("v".into(), "one".into())], 100).await.unwrap();
            let mut two = one.clone();
            for i in (0..VOLUME_BYTES / BLOCK).step_by(3) {
                let block: Vec<u8> = (0..BLOCK).map(|_| rng.u64() as u8).collect();
                a.write("v", i * BLOCK, &block).await.unwrap();
                two[(i * BLOCK) as usize..][..BLOCK as usize].copy_from_slice(&block);
            }
            a.create_snapshots(&[("v".into(), "two".into())], 200).await.unwrap();
            receive(&b, "w", &send(&a, "one", None).await).await.unwrap();
            let incremental = send(&a, "two", Some("one")).await;
            a.sync().await.unwrap();
            b.sync().await.unwrap();
            (one, two, incremental)
        })
        .unwrap();
    let a_images: Vec<SimImage> = a_legs.iter().map(|d| d.durable_image()).collect();
    let b_images: Vec<SimImage> = b_legs.iter().map(|d| d.durable_image()).collect();

    // How long a receive takes, uncut, in virtual time: the cuts fall within it.
    let sim = Sim::new(41);
    let b = common::revive(&sim, b_images.clone(), SimProfile::ssd(), LEG_BYTES);
    let (env, t, stream) = (sim.env(), tunables.clone(), incremental.clone());
    let (took, _) = sim
        .run(async move {
            let pool = Pool::import(&env, common::leaf_specs(&b), "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            let start = env.now();
            receive(&store, "w", &stream).await.unwrap();
            env.now().since(start)
        })
        .unwrap();

    let outcomes = Arc::new(Mutex::new([0u32; 4]));
    for cut in 0..24u64 {
        let resumable = cut % 2 == 1;
        let sim = Sim::new(100 + cut);
        let b = common::revive(&sim, b_images.clone(), SimProfile::ssd(), LEG_BYTES);
        let (env, t, stream) = (sim.env(), tunables.clone(), incremental.clone());
        let at = took.mul_f64((cut as f64 + 0.5) / 22.0);
        let (devices, kept) = (b.clone(), b.clone());
        let failed = Arc::new(AtomicBool::new(false));
        let cut_short = Arc::clone(&failed);
        sim.run(async move {
            let pool = Pool::import(&env, common::leaf_specs(&b), "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            let flag = Arc::new(AtomicBool::new(false));
            let (f, legs, clock) = (Arc::clone(&flag), devices.clone(), env.clone());
            env.spawn("crasher", async move {
                clock.sleep(at).await;
                if !f.swap(true, Ordering::SeqCst) {
                    for leg in &legs {
                        leg.crash(CrashPolicy::Any);
                        leg.inject(Fault::Lost);
                    }
                }
            });
            let failed = cut_short;
            let result = if resumable {
                receive_resumable(&store, "w", &stream).await
            } else {
                receive(&store, "w", &stream).await
            };
            assert!(result.is_ok() || flag.load(Ordering::SeqCst), "cut {cut}: {result:?}");
            failed.store(result.is_err(), Ordering::SeqCst);
            if !flag.swap(true, Ordering::SeqCst) {
                for leg in &devices {
                    leg.crash(CrashPolicy::Any);
                }
            }
        })
        .unwrap();
        let images: Vec<SimImage> = kept.iter().map(|d| d.durable_image()).collect();

        let sim = Sim::new(200 + cut);
        let a = common::revive(&sim, a_images.clone(), SimProfile::ssd(), LEG_BYTES);
        let b = common::revive(&sim, images, SimProfile::ssd(), LEG_BYTES);
        let (env, t) = (sim.env(), tunables.clone());
        let (one, two, outcomes) = (one.clone(), two.clone(), Arc::clone(&outcomes));
        let failed = Arc::clone(&failed);
        sim.run(async move {
            let pool = Pool::import(&env, common::leaf_specs(&b), "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            assert!(store.volumes().iter().all(|v| !v.name.starts_with('%')), "cut {cut}");
            let names: Vec<String> =
                store.snapshots("w").unwrap().into_iter().map(|s| s.name).collect();
            let data = store.read("w", 0, VOLUME_BYTES).await.unwrap();
            let tokens = store.interrupted_receives();
            if names == ["one", "two"] {
                assert!(data == two, "cut {cut}: w has @two and other bytes");
                assert!(tokens.is_empty(), "cut {cut}: a token beside a finished receive");
                outcomes.lock().unwrap()[0] += 1;
                // The receive failed at the cut, yet its snapshot is there: import finished
                // putting it in place.
                if failed.load(Ordering::SeqCst) {
                    outcomes.lock().unwrap()[3] += 1;
                }
            } else {
                assert_eq!(names, ["one"], "cut {cut}");
                assert!(data == one, "cut {cut}: w has only @one and other bytes");
                if tokens.is_empty() {
                    outcomes.lock().unwrap()[1] += 1;
                } else {
                    assert!(resumable, "cut {cut}: a token from a receive that was all or nothing");
                    let pool =
                        Pool::import(&env, common::leaf_specs(&a), "tank", &t).await.unwrap();
                    let a = Store::open(pool, &t).await.unwrap();
                    let rest = send_resume(&a, &tokens[0].1).await;
                    receive(&store, "w", &rest).await.unwrap();
                    assert!(store.read("w", 0, VOLUME_BYTES).await.unwrap() == two, "cut {cut}");
                    outcomes.lock().unwrap()[2] += 1;
                }
            }
            audit_clean(&store, &format!("cut {cut}")).await;
        })
        .unwrap();
    }
    let [finished, before, resumed, rolled_forward] = *outcomes.lock().unwrap();
    eprintln!(
        "{finished} finished ({rolled_forward} by import), {before} as before, {resumed} resumed"
    );
    // Code probes: cuts fell before the end, after it, while a resumable one had a token, and
    // between the snapshot and the rename.
    assert!(
        finished > 0 && before > 0 && resumed > 0 && rolled_forward > 0,
        "{finished} {before} {resumed} {rolled_forward}"
    );
}

/// A client writing the target while an incremental receive into it runs: every write that
/// was answered OK is in the target afterwards, whether the receive was refused (a write came
/// before its check) or replaced the target (writes waited, then failed or went to the
/// received volume). None is lost.
#[test]
fn writes_racing_an_incremental_receive_are_never_lost() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    let mut outcomes = [0u32; 2];
    for trial in 0..16u64 {
        let sim = Sim::new(300 + trial);
        let a_legs = common::legs(&sim, 2, SimProfile::ssd(), 64 << 20);
        let b_legs = common::legs(&sim, 2, SimProfile::ssd(), 64 << 20);
        let env = sim.env();
        let (received, _) = sim
            .run(async move {
                let tunables = Tunables::default();
                let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &tunables).await;
                let b = Arc::new(
                    common::mirror_store(&env, common::leaf_specs(&b_legs), &tunables).await,
                );
                let mut rng = Rng::new(6);
                a.create_volume("v", VOLUME_BYTES, BLOCK as u32).unwrap();
                let one: Vec<u8> = (0..VOLUME_BYTES).map(|_| rng.u64() as u8).collect();
                a.write("v", 0, &one).await.unwrap();
                a.create_snapshots(&[("v".into(), "one".into())], 100).await.unwrap();
                for i in (0..VOLUME_BYTES / BLOCK).step_by(2) {
                    a.write("v", i * BLOCK, &[i as u8; BLOCK as usize]).await.unwrap();
                }
                a.create_snapshots(&[("v".into(), "two".into())], 200).await.unwrap();
                receive(&b, "w", &send(&a, "one", None).await).await.unwrap();
                let incremental = send(&a, "two", Some("one")).await;
                // The writer starts at a different moment each trial, then writes a distinct
                // 512-byte sector every 50 us.
                let answered = Arc::new(Mutex::new(Vec::new()));
                let (writer_store, log, clock) =
                    (Arc::clone(&b), Arc::clone(&answered), env.clone());
                env.spawn("writer", async move {
                    // The receive takes about 5 ms of virtual time.
                    clock.sleep(Duration::from_micros(trial * 400)).await;
                    for n in 0..64u64 {
                        let data = vec![(n as u8).wrapping_add(1); 512];
                        if writer_store.write("w", n * 512, &data).await.is_ok() {
                            log.lock().unwrap().push((n * 512, data));
                        }
                        clock.sleep(Duration::from_micros(50)).await;
                    }
                });
                let result = receive(&b, "w", &incremental).await;
                env.sleep(Duration::from_millis(20)).await;
                let answered = answered.lock().unwrap().clone();
                for (offset, data) in &answered {
                    let got = b.read("w", *offset, 512).await.unwrap();
                    assert!(got == *data, "trial {trial}: an answered write at {offset} is lost");
                }
                b.sync().await.unwrap();
                audit_clean(&b, &format!("trial {trial}")).await;
                result.is_ok()
            })
            .unwrap();
        outcomes[usize::from(received)] += 1;
    }
    // Code probes: some receives were refused for a write, some replaced the target.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}
