//! Encrypted volumes on the simulator (docs/design.md, Encryption): what is written is
//! unreadable on the disks, every key format round-trips, a wrong key is refused and changes
//! nothing, a pool imports without any key and serves an encrypted volume only once its key
//! is loaded, `change_key` rewraps without touching data, `unload_key` writes what is dirty
//! before it forgets the key, clones share the family's key, scrub repairs an encrypted
//! volume with its key unloaded, and what is not built for encrypted volumes yet is refused by
//! name.

use crate::common;

use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::pool::Pool;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{KeyStatus, NewKey, Store, StoreError, VolumeProperty};
use sluice_engine::{CryptError, UserKey};
use sluice_format::{KeyFormat, KeyLocation};
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const VOLUME_BYTES: u64 = 4 << 20;

/// 4 MiB the test can recognize: numbered lines of text (which lz4 compresses, and each
/// 64-byte window of which occurs once) in the first half, random bytes in the second.
fn pattern() -> Vec<u8> {
    let mut data = Vec::with_capacity(VOLUME_BYTES as usize);
    let mut line = 0u64;
    while data.len() < VOLUME_BYTES as usize / 2 {
        data.extend_from_slice(format!("line {line:08} of the known plaintext\n").as_bytes());
        line += 1;
    }
    data.truncate(VOLUME_BYTES as usize / 2);
    data.extend(common::random_bytes(9, VOLUME_BYTES / 2));
    data
}

fn raw_key(byte: u8) -> NewKey {
    NewKey {
        format: KeyFormat::Raw,
        location: KeyLocation::Prompt,
        key: UserKey::new(vec![byte; 32]),
    }
}

/// Every byte each leg holds, read through the device.
async fn leg_bytes(leg: &SimDevice) -> Vec<u8> {
    let mut out = Vec::with_capacity(LEG_BYTES as usize);
    for at in (0..LEG_BYTES).step_by(1 << 20) {
        out.extend_from_slice(&leg.read_at(at, 1 << 20).await.unwrap());
    }
    out
}

async fn import(env: &sluice_engine::rt::Env, legs: &[SimDevice]) -> Store {
    let pool =
        Pool::import(env, common::leaf_specs(legs), "tank", &Tunables::default()).await.unwrap();
    Store::open(pool, &Tunables::default()).await.unwrap()
}

#[test]
fn an_encrypted_volume_leaves_no_plaintext_and_opens_only_with_its_key() {
    let sim = Sim::new(31);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(7)).await.unwrap();
        // The same data in two volumes that are not encrypted: stored as it is, and compressed.
        store.create_volume("plain", VOLUME_BYTES, 16384).unwrap();
        store
            .set_property("plain", VolumeProperty::Compression(sluice_format::Compression::Off))
            .unwrap();
        store.create_volume("plainlz4", VOLUME_BYTES, 16384).unwrap();
        let data = pattern();
        for volume in ["db", "plain", "plainlz4"] {
            store.write(volume, 0, &data).await.unwrap();
        }
        store.sync().await.unwrap();
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), data);
        assert_eq!(store.key_status("db").unwrap(), KeyStatus::Available);
        assert_eq!(store.key_status("plain").unwrap(), KeyStatus::None);
        store.export().await.unwrap();

        // On each disk, every piece of the data is found as often as the two volumes that
        // are not encrypted put it there, and no more: none comes from the encrypted volume,
        // neither its text, nor the text's lz4 form, nor its random half.
        let text = &data[40_000..40_064];
        let lz4 = lz4_flex::block::compress(&data[16384..32768]);
        let random = &data[VOLUME_BYTES as usize / 2 + 5000..][..64];
        for leg in &legs {
            let bytes = leg_bytes(leg).await;
            let count =
                |needle: &[u8]| bytes.windows(needle.len()).filter(|w| *w == needle).count();
            assert_eq!(count(text), 1, "the text: the plain volume's copy only");
            assert_eq!(count(&lz4[16..80]), 1, "its lz4 form: plainlz4's copy only");
            assert_eq!(count(random), 2, "the random bytes: both plain volumes' copies only");
        }

        // Imported without any key: the volume is there, its key is not.
        let store = import(&env, &legs).await;
        assert_eq!(store.key_status("db").unwrap(), KeyStatus::Unavailable);
        assert!(matches!(store.read("db", 0, 4096).await, Err(StoreError::KeyUnavailable { .. })));
        assert!(matches!(
            store.write("db", 0, &[1; 4096]).await,
            Err(StoreError::KeyUnavailable { .. })
        ));
        assert_eq!(store.read("plain", 0, VOLUME_BYTES).await.unwrap(), data);
        // A wrong key is refused and changes nothing.
        let wrong = store.load_key("db", &UserKey::new(vec![8; 32])).await;
        assert!(
            matches!(wrong, Err(StoreError::Key { cause: CryptError::WrongKey, .. })),
            "{wrong:?}"
        );
        assert_eq!(store.key_status("db").unwrap(), KeyStatus::Unavailable);
        let malformed = store.load_key("db", &UserKey::new(vec![7; 31])).await;
        assert!(matches!(
            malformed,
            Err(StoreError::Key { cause: CryptError::RawKeyLength { .. }, .. })
        ));
        store.load_key("db", &UserKey::new(vec![7; 32])).await.unwrap();
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), data);
        assert!(matches!(
            store.load_key("db", &UserKey::new(vec![7; 32])).await,
            Err(StoreError::KeyLoaded { .. })
        ));
        // Writes again, across another export and import.
        store.write("db", 8192, &[0xab; 8192]).await.unwrap();
        store.export().await.unwrap();
        let store = import(&env, &legs).await;
        store.load_key("db", &UserKey::new(vec![7; 32])).await.unwrap();
        let mut expect = data.clone();
        expect[8192..16384].fill(0xab);
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), expect);
        let report = store.audit().await.unwrap();
        assert!(report.is_clean(), "audit: {:?}", report.problems);
    })
    .unwrap();
}

/// Each key format, as a key file holds it (a hex key with its newline), opens after import;
/// the passphrase through Argon2id at the stored parameters.
#[test]
fn every_key_format_round_trips_through_import() {
    let sim = Sim::new(32);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        let hex = b"00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n".to_vec();
        let keys = [
            ("raw", KeyFormat::Raw, vec![3u8; 32]),
            ("hex", KeyFormat::Hex, hex),
            ("phrase", KeyFormat::Passphrase, b"correct horse battery".to_vec()),
        ];
        for (i, (name, format, key)) in keys.iter().enumerate() {
            let location = KeyLocation::File(format!("/etc/sluice/{name}.key"));
            let new = NewKey { format: *format, location, key: UserKey::new(key.clone()) };
            store.create_encrypted_volume(name, VOLUME_BYTES, 16384, false, new).await.unwrap();
            store.write(name, 0, &[i as u8 + 1; 65536]).await.unwrap();
        }
        store.export().await.unwrap();
        let store = import(&env, &legs).await;
        for (i, (name, format, key)) in keys.iter().enumerate() {
            let info = store.encryption(name).unwrap().unwrap();
            assert_eq!((info.format, info.status), (*format, KeyStatus::Unavailable));
            assert_eq!(info.location, KeyLocation::File(format!("/etc/sluice/{name}.key")));
            store.load_key(name, &UserKey::new(key.clone())).await.unwrap();
            assert_eq!(store.read(name, 0, 65536).await.unwrap(), vec![i as u8 + 1; 65536]);
        }
        // Too short a passphrase is refused at create, by its length.
        let short = NewKey {
            format: KeyFormat::Passphrase,
            location: KeyLocation::Prompt,
            key: UserKey::new(b"short".to_vec()),
        };
        let refused = store.create_encrypted_volume("x", VOLUME_BYTES, 16384, false, short).await;
        assert!(matches!(
            refused,
            Err(StoreError::Key { cause: CryptError::PassphraseLength { found: 5 }, .. })
        ));
        assert!(store.dataset("x").is_err(), "nothing was created");
    })
    .unwrap();
}

/// `change_key` rewraps the master key: after export only the new key opens the volume, and
/// the data (never rewritten) reads back.
#[test]
fn a_changed_key_is_the_only_key_after_import() {
    let sim = Sim::new(33);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(1)).await.unwrap();
        let data = pattern();
        store.write("db", 0, &data).await.unwrap();
        store.sync().await.unwrap();
        let new = NewKey {
            format: KeyFormat::Passphrase,
            location: KeyLocation::Prompt,
            key: UserKey::new(b"a new passphrase".to_vec()),
        };
        store.change_key("db", new).unwrap();
        store.export().await.unwrap();
        let store = import(&env, &legs).await;
        let old = store.load_key("db", &UserKey::new(vec![1; 32])).await;
        assert!(matches!(old, Err(StoreError::Key { .. })), "the old key: {old:?}");
        store.load_key("db", &UserKey::new(b"a new passphrase".to_vec())).await.unwrap();
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), data);
    })
    .unwrap();
}

/// `unload_key` writes the family's dirty data first, then refuses reads and writes (the
/// cache forgotten too) until a `load_key`; a clone of a snapshot shares the family's key.
#[test]
fn unload_writes_what_is_dirty_and_clones_share_the_key() {
    let sim = Sim::new(34);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(5)).await.unwrap();
        let data = pattern();
        store.write("db", 0, &data).await.unwrap();
        store.create_snapshots(&[("db".into(), "s1".into())], 100).await.unwrap();
        store.clone_snapshot("db", "s1", "copy").await.unwrap();
        store.write("db", 0, &[9; 16384]).await.unwrap();
        store.unload_key("copy").await.unwrap();
        assert_eq!(store.key_status("db").unwrap(), KeyStatus::Unavailable, "one family");
        assert!(store.read("db", 0, 16384).await.is_err(), "nothing readable, cached or not");
        assert!(store.read("copy", 0, 16384).await.is_err());
        assert!(matches!(
            store.write("db", 0, &[1; 512]).await,
            Err(StoreError::KeyUnavailable { .. })
        ));
        assert!(matches!(store.unload_key("db").await, Err(StoreError::KeyNotLoaded { .. })));
        // A snapshot is of its volume's family; a resize, which changes the tree, needs the key
        // as a write does (and the pool goes on).
        assert_eq!(store.key_status("db@s1").unwrap(), KeyStatus::Unavailable);
        let resized = store.resize_volume("db", 2 * VOLUME_BYTES).await;
        assert!(matches!(resized, Err(StoreError::KeyUnavailable { .. })), "{resized:?}");
        let resized = store.resize_volume("db", VOLUME_BYTES / 2).await;
        assert!(matches!(resized, Err(StoreError::KeyUnavailable { .. })), "{resized:?}");
        store.sync().await.unwrap();
        assert!(!store.is_suspended());
        store.load_key("db", &UserKey::new(vec![5; 32])).await.unwrap();
        assert_eq!(store.read("copy", 0, VOLUME_BYTES).await.unwrap(), data);
        assert_eq!(store.key_status("db@s1").unwrap(), KeyStatus::Available);
        let mut expect = data.clone();
        expect[..16384].fill(9);
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), expect);
        // An encrypted volume goes only raw (`send -w`), and says so.
        let send = store.send_snapshot("db", "s1", None, &mut |_| Ok(())).await;
        let refused = send.unwrap_err().to_string();
        assert!(refused.contains("send it with -w"), "{refused}");
        assert!(matches!(store.unload_key("plain").await, Err(StoreError::NoSuchVolume { .. })));
    })
    .unwrap();
}

/// A scrub with the key unloaded repairs an encrypted volume from its good copies (the
/// checksum is over the ciphertext); the data then reads back with the key.
#[test]
fn scrub_repairs_an_encrypted_volume_without_its_key() {
    let sim = Sim::new(35);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(6)).await.unwrap();
        let data = pattern();
        store.write("db", 0, &data).await.unwrap();
        store.unload_key("db").await.unwrap();
        // Garbage over most of the second leg's data area.
        let garbage = vec![0x5a; 1 << 20];
        for at in (8u64 << 20..40 << 20).step_by(1 << 20) {
            legs[1].write_at(at, sluice_engine::SharedBuf::copy_from(&garbage)).await.unwrap();
        }
        let report = store.pool().scrub().await.unwrap();
        assert!(report.repaired > 0, "{report:?}");
        let again = store.pool().scrub().await.unwrap();
        assert_eq!(again.repaired, 0, "{again:?}");
        store.load_key("db", &UserKey::new(vec![6; 32])).await.unwrap();
        assert_eq!(store.read("db", 0, VOLUME_BYTES).await.unwrap(), data);
    })
    .unwrap();
}

/// Dedup shares blocks within a key family (a volume and its clones) and never across
/// families or with volumes that are not encrypted: the same data written into each is stored
/// once per family, and every copy reads back after import with its key.
#[test]
fn dedup_shares_within_a_family_and_never_across() {
    let sim = Sim::new(36);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("a", VOLUME_BYTES, 16384, false, raw_key(1)).await.unwrap();
        store.create_encrypted_volume("b", VOLUME_BYTES, 16384, false, raw_key(2)).await.unwrap();
        store.create_volume("p", VOLUME_BYTES, 16384).unwrap();
        for volume in ["a", "b", "p"] {
            store.set_dedup(volume, sluice_format::DedupMode::Verify).unwrap();
        }
        // 64 blocks none of which repeats.
        let data = common::random_bytes(77, 1 << 20);
        store.write("a", 0, &data).await.unwrap();
        store.create_snapshots(&[("a".into(), "s".into())], 1).await.unwrap();
        store.clone_snapshot("a", "s", "ac").await.unwrap();
        let shared = || store.dedup_table().stats().blocks_shared.get();
        let before = shared();
        // The clone, of a's family: every block shared. b's family and the plain volume: none.
        store.write("ac", 1 << 20, &data).await.unwrap();
        store.write("b", 0, &data).await.unwrap();
        store.write("p", 0, &data).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(shared() - before, 64, "only the clone's blocks are shared");
        let report = store.audit().await.unwrap();
        assert!(report.is_clean(), "audit: {:?}", report.problems);
        store.export().await.unwrap();
        let store = import(&env, &legs).await;
        store.load_key("a", &UserKey::new(vec![1; 32])).await.unwrap();
        store.load_key("b", &UserKey::new(vec![2; 32])).await.unwrap();
        assert_eq!(store.read("ac", 1 << 20, 1 << 20).await.unwrap(), data);
        assert_eq!(store.read("a", 0, 1 << 20).await.unwrap(), data);
        assert_eq!(store.read("b", 0, 1 << 20).await.unwrap(), data);
        assert_eq!(store.read("p", 0, 1 << 20).await.unwrap(), data);
        // Overwritten, the shared blocks lose a reference each and stay readable where kept.
        store.write("ac", 1 << 20, &vec![0x11; 1 << 20]).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.read("a", 0, 1 << 20).await.unwrap(), data);
        let report = store.audit().await.unwrap();
        assert!(report.is_clean(), "audit: {:?}", report.problems);
    })
    .unwrap();
}

/// A 4 KiB unit a test can find on the disks: its number in recognizable text.
fn log_unit(unit: u64) -> Vec<u8> {
    let line = format!("sealed log record {unit:04} of the known plaintext.\n");
    line.as_bytes().iter().copied().cycle().take(4096).collect()
}

/// Where sealed log blocks begin on a leg's bytes: the magic at a 4 KiB boundary, version 7,
/// flags 1.
fn sealed_log_blocks(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len())
        .step_by(4096)
        .filter(|&at| {
            bytes[at..at + 8] == *b"SLUICELG" && bytes[at + 8] == 7 && bytes[at + 11] == 1
        })
        .collect()
}

/// The disks a power cut leaves once everything sent to `devices` has arrived and every write
/// their caches held is lost, revived in `fresh`'s world.
fn after_power_cut(fresh: &Sim, devices: &[SimDevice], seed: u64) -> Vec<SimDevice> {
    use sluice_engine::device::sim::{CrashPolicy, SimOptions};
    let mut rng = sluice_engine::rt::Rng::new(seed);
    let images: Vec<_> = devices
        .iter()
        .map(|d| d.crash_image(d.write_log().len(), CrashPolicy::DropAll, &mut rng).unwrap())
        .collect();
    let options = SimOptions { store_data: true, record_log: true };
    common::revive_with(fresh, images, SimProfile::ssd(), LEG_BYTES, options)
}

/// Writes acknowledged through an encrypted volume's log, then a power cut: the records are
/// sealed (no copy of the data on the disks), import claims them without the key and keeps
/// them claimed across syncs and another import, the volume refuses snapshot, rollback,
/// resize, rename and destroy meanwhile, naming why, and `key load` replays them.
#[test]
fn an_encrypted_volumes_log_replays_once_its_key_is_loaded() {
    use sluice_engine::device::sim::SimOptions;
    use sluice_engine::volume::Volume;
    use std::sync::Arc;

    let sim = Sim::new(41);
    let options = SimOptions { store_data: true, record_log: true };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEG_BYTES, options);
    let devices = legs.clone();
    let env = sim.env();
    // A large write is logged by pointer (its blocks written in place, sealed as the sync
    // would), the small ones copied into sealed records.
    let tunables = || {
        Tunables::with([("txg.dirty_max", "64M"), ("intent_log.immediate_write_bytes", "32K")])
            .unwrap()
    };
    let large: Vec<u8> = (0..64u64 << 10).map(|i| (i % 253) as u8).collect();
    let expected = large.clone();
    sim.run(async move {
        let store =
            Arc::new(common::mirror_store(&env, common::leaf_specs(&legs), &tunables()).await);
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(4)).await.unwrap();
        store.create_volume("plain", VOLUME_BYTES, 16384).unwrap();
        store.create_snapshots(&[("db".to_owned(), "before".to_owned())], 1).await.unwrap();
        let db = Volume::open(&store, "db").unwrap();
        for unit in 0..8 {
            db.write(unit * 4096, &log_unit(unit), unit % 2 == 0).await.unwrap();
        }
        db.zero(8 * 4096, 4096, false).await.unwrap();
        db.write(1 << 20, &large, false).await.unwrap();
        db.flush().await.unwrap();
    })
    .unwrap();

    let fresh = Sim::new(42);
    let legs = after_power_cut(&fresh, &devices, 5);
    let env = fresh.env();
    fresh
        .run(async move {
            for leg in &legs {
                let bytes = leg_bytes(leg).await;
                assert!(!sealed_log_blocks(&bytes).is_empty(), "the log's blocks are sealed");
                let needle = &log_unit(3)[..64];
                assert!(
                    !bytes.windows(64).any(|w| w == needle),
                    "a logged write's data is on the disk in the clear"
                );
            }
            let import = || async {
                let pool = Pool::import(&env, common::leaf_specs(&legs), "tank", &tunables())
                    .await
                    .unwrap();
                Store::open(pool, &tunables()).await.unwrap()
            };
            let store = import().await;
            assert!(store.log_awaits_key("db"));
            assert_eq!(store.log_stats().records_replayed.get(), 0);
            // The pool goes on: other volumes write and sync, and the chain stays claimed.
            for round in 0..3u8 {
                store.write("plain", 0, &vec![round; 65536]).await.unwrap();
                store.sync().await.unwrap();
            }
            let refusals = [
                store.create_snapshots(&[("db".to_owned(), "now".to_owned())], 2).await.err(),
                store.rollback_volume("db", "before", false).await.err(),
                store.resize_volume("db", 2 * VOLUME_BYTES).await.err(),
                store.rename_volume("db", "db2").await.err(),
                store.destroy_volume_with("db", true).await.err(),
            ];
            for refusal in refusals {
                let refusal = refusal.expect("refused while the log waits for the key");
                assert!(matches!(refusal, StoreError::LogAwaitsKey { .. }), "{refusal}");
                assert!(refusal.to_string().contains("sluice key load tank/db"), "{refusal}");
            }
            store.export().await.unwrap();

            // Imported again, still without the key: claimed again from the same header.
            let store = import().await;
            assert!(store.log_awaits_key("db"));
            let wrong = store.load_key("db", &UserKey::new(vec![5; 32])).await;
            assert!(matches!(wrong, Err(StoreError::Key { cause: CryptError::WrongKey, .. })));
            assert!(store.log_awaits_key("db"), "a wrong key replays nothing");
            store.load_key("db", &UserKey::new(vec![4; 32])).await.unwrap();
            assert!(!store.log_awaits_key("db"));
            let stats = store.log_stats();
            assert_eq!(
                (stats.records_replayed.get(), stats.indirect_records_replayed.get()),
                (13, 4),
                "8 copied writes, a zero, and the large write's 4 blocks by pointer"
            );
            for unit in 0..8 {
                assert_eq!(store.read("db", unit * 4096, 4096).await.unwrap(), log_unit(unit));
            }
            assert_eq!(store.read("db", 8 * 4096, 4096).await.unwrap(), vec![0; 4096]);
            assert!(store.read("db", 1 << 20, 64 << 10).await.unwrap() == expected);
            // Replayed, the volume is writable and its new chain logs as before.
            store.write("db", 0, &[1; 4096]).await.unwrap();
            store.create_snapshots(&[("db".to_owned(), "after".to_owned())], 3).await.unwrap();
            store.export().await.unwrap();
        })
        .unwrap();
}

/// A sealed log record changed on the disk, its block's checksum made to match, fails its tag
/// at replay: the key load is refused, naming the record, the key is not left loaded, and the
/// records still wait.
#[test]
fn a_forged_log_record_fails_authentication_at_replay() {
    use sluice_engine::device::sim::SimOptions;
    use sluice_engine::volume::Volume;
    use sluice_format::ChecksumAlg;
    use std::sync::Arc;

    let sim = Sim::new(43);
    let options = SimOptions { store_data: true, record_log: true };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEG_BYTES, options);
    let devices = legs.clone();
    let env = sim.env();
    sim.run(async move {
        let tunables = Tunables::default();
        let store =
            Arc::new(common::mirror_store(&env, common::leaf_specs(&legs), &tunables).await);
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(4)).await.unwrap();
        store.sync().await.unwrap();
        let db = Volume::open(&store, "db").unwrap();
        for unit in 0..4 {
            db.write(unit * 4096, &log_unit(unit), true).await.unwrap();
        }
    })
    .unwrap();
    let fresh = Sim::new(44);
    let legs = after_power_cut(&fresh, &devices, 6);
    let env = fresh.env();
    fresh
        .run(async move {
            // On both legs: one ciphertext byte of each sealed block's first record (a write)
            // flipped, and the block's checksum recomputed, as an attacker with the disk can.
            let mut forged = 0;
            for leg in &legs {
                let bytes = leg_bytes(leg).await;
                for at in sealed_log_blocks(&bytes) {
                    let used = u32::from_le_bytes(bytes[at + 40..at + 44].try_into().unwrap());
                    let covered = (used as usize).div_ceil(4096) * 4096;
                    let mut block = bytes[at..at + covered].to_vec();
                    if block[192] != 1 {
                        continue;
                    }
                    block[192 + 24 + 40 + 16] ^= 1;
                    block[176..192].fill(0);
                    let sum = ChecksumAlg::Xxh3_128.compute(&block);
                    block[176..192].copy_from_slice(&sum.0);
                    let buf = sluice_engine::SharedBuf::copy_from(&block);
                    leg.write_at(at as u64, buf).await.unwrap();
                    forged += 1;
                }
            }
            assert!(forged >= 2, "a sealed block with a write on each leg");
            let pool = Pool::import(&env, common::leaf_specs(&legs), "tank", &Tunables::default())
                .await
                .unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store.log_awaits_key("db"), "import claims the forged chain: it verifies");
            let refused = store.load_key("db", &UserKey::new(vec![4; 32])).await;
            match refused {
                Err(StoreError::LogAuthentication { ref volume, .. }) => assert_eq!(volume, "db"),
                other => panic!("expected a log authentication failure, got {other:?}"),
            }
            assert_eq!(store.key_status("db").unwrap(), KeyStatus::Unavailable);
            assert!(store.log_awaits_key("db"));
            assert_eq!(store.log_stats().records_replayed.get(), 0);
            // `vol destroy -f`: the records go with the volume, and their blocks are freed.
            store.destroy_volume_discarding_log("db", true).await.unwrap();
            assert!(!store.log_awaits_key("db"));
            store.export().await.unwrap();
            let pool = Pool::import(&env, common::leaf_specs(&legs), "tank", &Tunables::default())
                .await
                .unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store.volumes().is_empty());
            assert_eq!(store.log_stats().chains_claimed.get(), 0);
            store.export().await.unwrap();
        })
        .unwrap();
}

/// A key family no volume names any more is dropped: its last volume destroyed, the next sync
/// records only the families in use, and a family being made is kept meanwhile.
#[test]
fn a_family_without_volumes_is_dropped() {
    let sim = Sim::new(45);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store =
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await;
        store.create_encrypted_volume("a", VOLUME_BYTES, 16384, false, raw_key(1)).await.unwrap();
        store.create_encrypted_volume("b", VOLUME_BYTES, 16384, false, raw_key(2)).await.unwrap();
        store.create_snapshots(&[("b".to_owned(), "s".to_owned())], 1).await.unwrap();
        store.clone_snapshot("b", "s", "c").await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.key_families().len(), 2);
        let b = store.encryption("b").unwrap().unwrap().family;
        // The clone still names b's family.
        store.destroy_volume_with("b", true).await.unwrap_err();
        store.destroy_volume_with("c", false).await.unwrap();
        store.destroy_volume_with("b", true).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.key_families(), vec![store.encryption("a").unwrap().unwrap().family]);
        assert!(!store.key_families().contains(&b));
        store.export().await.unwrap();
        let store = import(&env, &legs).await;
        assert_eq!(store.key_families().len(), 1);
        store.load_key("a", &UserKey::new(vec![1; 32])).await.unwrap();
        store.export().await.unwrap();
    })
    .unwrap();
}

/// A second pool's two disks, named b0 and b1 (the first pool's are leg0 and leg1).
fn second_pool_legs(sim: &Sim) -> Vec<SimDevice> {
    (0..2)
        .map(|i| {
            let name = format!("b{i}");
            SimDevice::new(&sim.env(), &name, SimProfile::Instant, LEG_BYTES, Default::default())
        })
        .collect()
}

/// A raw stream of `volume@snapshot` (since `from`), as bytes.
async fn send_raw(store: &Store, volume: &str, snapshot: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = sluice_format::StreamWriter::new(&mut out);
    {
        let mut emit = |record| writer.write(&record);
        store.send_snapshot_raw(volume, snapshot, from, &mut emit).await.unwrap();
    }
    writer.finish().unwrap();
    out
}

async fn receive_stream(store: &Store, target: &str, stream: &[u8]) -> Result<(), StoreError> {
    let mut reader = sluice_format::StreamReader::new(stream);
    let mut next = || reader.next_record();
    store.receive(target, sluice_engine::txg::ReceiveMode::Whole, &mut next).await.map(|_| ())
}

/// Raw send and receive: an encrypted volume goes to a second pool that never has its key,
/// in a full stream and an incremental one; the stream and that pool's disks hold no
/// plaintext; the copy there scrubs and repairs without the key and is sent on, raw, back to
/// the first pool, where it joins its family and reads as the original; and once the key is
/// loaded on the second pool, the copy's root MAC verifies and it reads the same bytes. A raw
/// stream onto a volume that is not encrypted, and a stream that is not raw onto an encrypted
/// one, are refused.
#[test]
fn raw_streams_carry_an_encrypted_volume_without_its_key() {
    let sim = Sim::new(47);
    let a_legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let b_legs = second_pool_legs(&sim);
    let env = sim.env();
    sim.run(async move {
        let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &Tunables::default()).await;
        let b = common::mirror_store(&env, common::leaf_specs(&b_legs), &Tunables::default()).await;
        a.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(7)).await.unwrap();
        let mut expected = pattern();
        // Holes too: the first 64 KiB and a range in the middle are never written.
        expected[..65536].fill(0);
        expected[1 << 20..(1 << 20) + 49152].fill(0);
        a.write("db", 65536, &expected[65536..1 << 20]).await.unwrap();
        a.write("db", (1 << 20) + 49152, &expected[(1 << 20) + 49152..]).await.unwrap();
        a.create_snapshots(&[("db".to_owned(), "s1".to_owned())], 1).await.unwrap();
        let full = send_raw(&a, "db", "s1", None).await;
        let text = expected[100_000..100_064].to_vec();
        assert!(text.starts_with(b"line") || text.contains(&b' '), "a window of the text");
        assert!(!full.windows(64).any(|w| w == text), "the raw stream holds plaintext");

        receive_stream(&b, "copy", &full).await.unwrap();
        assert_eq!(b.key_status("copy").unwrap(), KeyStatus::Unavailable);
        assert!(b.read("copy", 0, 4096).await.is_err(), "read without the key");

        // Changes: a rewrite, a trim, a write into a hole; then the incremental stream.
        let rewrite: Vec<u8> = (0..65536u32).map(|i| (i % 199) as u8).collect();
        a.write("db", 2 << 20, &rewrite).await.unwrap();
        expected[2 << 20..(2 << 20) + 65536].copy_from_slice(&rewrite);
        a.zero("db", 3 << 20, 131072).await.unwrap();
        expected[3 << 20..(3 << 20) + 131072].fill(0);
        a.write("db", 16384, &rewrite[..16384]).await.unwrap();
        expected[16384..32768].copy_from_slice(&rewrite[..16384]);
        a.create_snapshots(&[("db".to_owned(), "s2".to_owned())], 2).await.unwrap();
        let incremental = send_raw(&a, "db", "s2", Some("s1")).await;
        receive_stream(&b, "copy", &incremental).await.unwrap();
        assert_eq!(b.key_status("copy").unwrap(), KeyStatus::Unavailable);

        // Refusals, which change nothing: a plain stream onto the encrypted copy, a raw one
        // onto a plain volume.
        b.create_volume("plain", VOLUME_BYTES, 16384).unwrap();
        b.create_snapshots(&[("plain".to_owned(), "p".to_owned())], 3).await.unwrap();
        let mut plain_stream = Vec::new();
        {
            let mut writer = sluice_format::StreamWriter::new(&mut plain_stream);
            {
                let mut emit = |record| writer.write(&record);
                b.send_snapshot("plain", "p", None, &mut emit).await.unwrap();
            }
            writer.finish().unwrap();
        }
        let refused = receive_stream(&b, "copy", &plain_stream).await.unwrap_err();
        assert!(refused.to_string().contains("is not raw"), "{refused}");
        let refused = receive_stream(&b, "plain", &incremental).await.unwrap_err();
        assert!(refused.to_string().contains("not encrypted"), "{refused}");

        // B's disks hold no plaintext; a scrub there repairs the copy without the key.
        b.sync().await.unwrap();
        for leg in &b_legs {
            let bytes = leg_bytes(leg).await;
            let found = bytes.windows(64).position(|w| w == text);
            assert!(found.is_none(), "pool b holds plaintext at {found:?} of {}", leg.name());
        }
        for leg in &a_legs {
            let bytes = leg_bytes(leg).await;
            let found = bytes.windows(64).position(|w| w == text);
            assert!(found.is_none(), "pool a holds plaintext at {found:?} of {}", leg.name());
        }
        let garbage = vec![0x5a; 1 << 20];
        for at in (8u64 << 20..40 << 20).step_by(1 << 20) {
            b_legs[1].write_at(at, sluice_engine::SharedBuf::copy_from(&garbage)).await.unwrap();
        }
        let report = b.pool().scrub().await.unwrap();
        assert!(report.repaired > 0, "{report:?}");

        // Sent on from B, raw, back to A: it joins the family there and reads at once. A
        // block changed in the stream (its record's checksum made good) fails its tag there,
        // where the key is loaded, and the stream is refused.
        let back = send_raw(&b, "copy", "s2", None).await;
        let mut forged = Vec::new();
        {
            let mut reader = sluice_format::StreamReader::new(&back[..]);
            let mut writer = sluice_format::StreamWriter::new(&mut forged);
            let mut changed = false;
            while let Some(mut record) = reader.next_record().unwrap() {
                if let (false, sluice_format::StreamRecord::RawData { bytes, .. }) =
                    (changed, &mut record)
                {
                    bytes[100] ^= 1;
                    changed = true;
                }
                if !matches!(record, sluice_format::StreamRecord::End { .. }) {
                    writer.write(&record).unwrap();
                }
            }
            writer.finish().unwrap();
        }
        let refused = receive_stream(&a, "back", &forged).await.unwrap_err();
        assert!(refused.to_string().contains("fails its tag"), "{refused}");
        assert!(a.volume_info("back").is_none(), "a refused stream leaves nothing");
        receive_stream(&a, "back", &back).await.unwrap();
        assert_eq!(a.key_families().len(), 1, "the stream's family is the one A has");
        let db = a.read("db", 0, VOLUME_BYTES).await.unwrap();
        let first_diff = |got: &[u8]| got.iter().zip(&expected).position(|(x, y)| x != y);
        assert_eq!(first_diff(&db), None, "db");
        let got = a.read("back", 0, VOLUME_BYTES).await.unwrap();
        assert_eq!(first_diff(&got), None, "back");

        // On B with the key: every root verifies, and the copy reads the same bytes.
        b.load_key("copy", &UserKey::new(vec![7; 32])).await.unwrap();
        assert!(b.read("copy", 0, VOLUME_BYTES).await.unwrap() == expected);
        assert!(b.read("copy@s1", 0, 4096).await.is_ok());
        b.export().await.unwrap();
        a.export().await.unwrap();
    })
    .unwrap();
}

/// A volume that is not encrypted moves into encryption by a full stream received into a new
/// encrypted volume: none of its data reaches the receiving pool's disks in the clear, and it
/// reads back with the new key after an import. An incremental stream is refused for it.
#[test]
fn a_plain_stream_is_received_into_a_new_encrypted_volume() {
    let sim = Sim::new(49);
    let a_legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let b_legs = second_pool_legs(&sim);
    let env = sim.env();
    sim.run(async move {
        let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &Tunables::default()).await;
        let b = common::mirror_store(&env, common::leaf_specs(&b_legs), &Tunables::default()).await;
        a.create_volume("plain", VOLUME_BYTES, 16384).unwrap();
        let data = pattern();
        a.write("plain", 0, &data).await.unwrap();
        a.create_snapshots(&[("plain".to_owned(), "s1".to_owned())], 1).await.unwrap();
        a.write("plain", 0, &[3; 16384]).await.unwrap();
        a.create_snapshots(&[("plain".to_owned(), "s2".to_owned())], 2).await.unwrap();
        let stream = |from: Option<&'static str>, to: &'static str| {
            let a = &a;
            async move {
                let mut out = Vec::new();
                let mut writer = sluice_format::StreamWriter::new(&mut out);
                {
                    let mut emit = |record| writer.write(&record);
                    a.send_snapshot("plain", to, from, &mut emit).await.unwrap();
                }
                writer.finish().unwrap();
                out
            }
        };
        let full = stream(None, "s1").await;
        {
            let mut reader = sluice_format::StreamReader::new(&full[..]);
            let mut next = || reader.next_record();
            b.receive_encrypted("moved", raw_key(8), &mut next).await.unwrap();
        }
        assert_eq!(b.key_status("moved").unwrap(), KeyStatus::Available);
        assert!(b.read("moved", 0, VOLUME_BYTES).await.unwrap() == data);
        let incremental = stream(Some("s1"), "s2").await;
        let refused = {
            let mut reader = sluice_format::StreamReader::new(&incremental[..]);
            let mut next = || reader.next_record();
            b.receive_encrypted("moved", raw_key(8), &mut next).await.unwrap_err()
        };
        assert!(refused.to_string().contains("a full stream"), "{refused}");
        b.export().await.unwrap();
        let text = &data[40_000..40_064];
        let random = &data[VOLUME_BYTES as usize / 2 + 5000..][..64];
        for leg in &b_legs {
            let bytes = leg_bytes(leg).await;
            assert!(!bytes.windows(64).any(|w| w == text || w == random), "plaintext on b");
        }
        let pool = Pool::import(&env, common::leaf_specs(&b_legs), "tank", &Tunables::default())
            .await
            .unwrap();
        let b = Store::open(pool, &Tunables::default()).await.unwrap();
        assert_eq!(b.key_status("moved").unwrap(), KeyStatus::Unavailable);
        b.load_key("moved", &UserKey::new(vec![8; 32])).await.unwrap();
        assert!(b.read("moved", 0, VOLUME_BYTES).await.unwrap() == data);
        assert!(b.read("moved@s1", 0, VOLUME_BYTES).await.unwrap() == data);
        b.export().await.unwrap();
    })
    .unwrap();
}

/// A resilver with the key unloaded brings back a leg that missed an encrypted volume's
/// writes (it copies ciphertext, checked by its checksums): with the other leg gone and the
/// key loaded, the volume reads whole from it.
#[test]
fn resilver_repairs_an_encrypted_volume_without_its_key() {
    use sluice_engine::device::sim::Fault;
    use std::sync::Arc;

    let sim = Sim::new(51);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store = Arc::new(
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await,
        );
        store.create_encrypted_volume("db", VOLUME_BYTES, 16384, false, raw_key(9)).await.unwrap();
        let mut data = pattern();
        store.write("db", 0, &data[..VOLUME_BYTES as usize / 2]).await.unwrap();
        store.sync().await.unwrap();
        store.offline_leaf("leg1", true).await.unwrap();
        // Written while leg1 is away: only leg0 has it.
        store.write("db", VOLUME_BYTES / 2, &data[VOLUME_BYTES as usize / 2..]).await.unwrap();
        data[..16384].fill(0x33);
        store.write("db", 0, &[0x33; 16384]).await.unwrap();
        store.unload_key("db").await.unwrap();
        let (_, resilvering) = store.online_leaf("leg1").await.unwrap();
        assert!(resilvering, "leg1 missed txgs");
        store.wait_scan().await;
        let status = store.scan_status().unwrap();
        assert_eq!(status.unrecoverable, 0, "{status:?}");
        assert!(status.repaired_copies > 0, "{status:?}");
        legs[0].inject(Fault::Lost);
        store.load_key("db", &UserKey::new(vec![9; 32])).await.unwrap();
        assert!(store.read("db", 0, VOLUME_BYTES).await.unwrap() == data);
    })
    .unwrap();
}
