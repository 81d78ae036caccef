//! On-disk format tests: golden bytes pin every layout; encode/decode round-trips; decoders
//! never panic on arbitrary bytes; a flipped bit in a checksummed structure is always caught.
//!
//! Golden files live in tests/golden/. After an intended format change, regenerate them with
//! `SLUICE_BLESS=1 cargo test -p sluice-format --test format format::` and bump the format
//! version.

use crate::common::golden;
use std::path::PathBuf;

use proptest::prelude::*;
use sluice_format::{
    data_end_bytes, label_offsets, uberblock_offset, BlockCompression, BlockKind, BlockPointer,
    Checksum, ChecksumAlg, Compression, DdtBucket, DdtEntry, DdtHeader, DdtKey, Deadlist,
    DeadlistPiece, DedupMode, DirectoryRecords, Dva, FormatError, FormatVersion, LabelHeader,
    LeafConfig, LeafRecord, LeafRecordState, LogBias, LogHeader, Origin, PoolDirectory,
    PoolProperties, RaidzConfig, ReceiveState, ScanBookmark, ScanKind, ScanRecord, ScanRecordPhase,
    SchedulePeriod, ScheduleRule, SnapshotEntry, SpaceMap, SyncMode, TopConfig, TopKind, Uberblock,
    VdevTreeConfig, VolumeEntry, VolumeSpace, BLKPTR_BYTES, DATA_START_BYTES, DEADLIST_PIECE_BYTES,
    DEADLIST_PIECE_ENTRIES, LABEL_BYTES, LABEL_HEADER_BYTES, SCHEDULE_KEEP_MAX, UBERBLOCK_BYTES,
};

fn sample_bp() -> BlockPointer {
    BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 32, offset_sectors: 8192 },
            Dva { vdev: 1, asize_sectors: 32, offset_sectors: 16384 },
            Dva::default(),
        ],
        lsize_sectors: 32,
        psize_sectors: 32,
        birth_txg: 42,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::None,
        kind: BlockKind::Data,
        level: 0,
        fill: 1,
        checksum: ChecksumAlg::Xxh3_128.compute(&[7u8; 16384]),
        dedup: None,
        crypt: sluice_format::BlockCrypt::None,
    }
}

fn sample_dedup_bp(key: DdtKey) -> BlockPointer {
    BlockPointer { dedup: Some(key), ..sample_bp() }
}

fn sample_label() -> LabelHeader {
    LabelHeader {
        ashift: 12,
        pool_guid: 0x1122_3344_5566_7788,
        leaf_guid: 0x0102_0304_0506_0708,
        top_guid: 0x0a0b_0c0d_0e0f_1011,
        config_txg: 7,
        leaf_bytes: 1 << 30,
        pool_name: "tank".into(),
        config: VdevTreeConfig {
            top: vec![
                TopConfig {
                    kind: TopKind::Mirror,
                    log: false,
                    guid: 0x0a0b_0c0d_0e0f_1011,
                    children: vec![
                        LeafConfig { guid: 0x0102_0304_0506_0708, path: "/dev/disk/a".into() },
                        LeafConfig { guid: 0x0203_0405_0607_0809, path: "/dev/disk/b".into() },
                    ],
                    raidz: None,
                },
                TopConfig {
                    kind: TopKind::Leaf,
                    log: true,
                    guid: 99,
                    children: vec![LeafConfig { guid: 98, path: "c.img".into() }],
                    raidz: None,
                },
            ],
            encryption: false,
            properties: false,
            spares: Vec::new(),
            lz4_indirect: false,
        },
    }
}

/// A pool with a raidz2 of 6 whose column 3 is being replaced, a mirror and a log leaf: the
/// tree a V6 label and directory carry.
fn sample_raidz_config() -> VdevTreeConfig {
    let leaf = |guid, path: String| LeafConfig { guid, path };
    let disk = |i: u64| format!("/dev/disk/by-id/wwn-0x5000c500a1b2c3{i:02x}");
    VdevTreeConfig {
        top: vec![
            TopConfig {
                kind: TopKind::Raidz,
                log: false,
                guid: 0x2a2a_0000_0000_0001,
                children: (0..6).map(|i| leaf(0x2a2a_0000_0000_0010 + i, disk(i))).collect(),
                raidz: Some(RaidzConfig {
                    parity: 2,
                    // The smallest child's, a 4 TB disk.
                    child_end_bytes: data_end_bytes(4_000_787_030_016),
                    replacing: vec![(3, leaf(0x2a2a_0000_0000_0020, disk(0x20)))],
                    log_copies: false,
                }),
            },
            TopConfig {
                kind: TopKind::Mirror,
                log: false,
                guid: 0x2b2b_0000_0000_0001,
                children: vec![
                    leaf(0x2b2b_0000_0000_0010, disk(6)),
                    leaf(0x2b2b_0000_0000_0011, disk(7)),
                ],
                raidz: None,
            },
            TopConfig {
                kind: TopKind::Leaf,
                log: true,
                guid: 0x2c2c_0000_0000_0001,
                children: vec![leaf(0x2c2c_0000_0000_0010, "/dev/nvme0n1".into())],
                raidz: None,
            },
        ],
        encryption: false,
        properties: false,
        spares: Vec::new(),
        lz4_indirect: false,
    }
}

fn sample_raidz_label() -> LabelHeader {
    LabelHeader { config: sample_raidz_config(), ..sample_label() }
}

#[test]
fn golden_block_pointer() {
    let bytes = BlockPointer::encode(Some(&sample_bp()));
    golden("blkptr.bin", &bytes);
    assert_eq!(BlockPointer::decode(&bytes).unwrap(), Some(sample_bp()));
    assert_eq!(BlockPointer::decode(&[0; BLKPTR_BYTES]).unwrap(), None, "zeros are a hole");
}

#[test]
fn golden_uberblock() {
    let ub = Uberblock {
        txg: 42,
        pool_guid: 5,
        guid_sum: 11,
        timestamp_secs: 1_700_000_000,
        root: Some(sample_bp()),
        complete_txg: 40,
    };
    let bytes = ub.encode();
    golden("uberblock.bin", &bytes);
    assert_eq!(Uberblock::decode(&bytes).unwrap(), ub);
}

/// A V1 uberblock (written before each leaf's copy said which txgs it holds) still decodes,
/// as a copy whose leaf holds every txg up to its own.
#[test]
fn v1_uberblock_still_decodes() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/uberblock_v1.bin");
    let bytes = std::fs::read(path).unwrap();
    let ub = Uberblock::decode(&bytes).unwrap();
    assert_eq!((ub.txg, ub.pool_guid, ub.guid_sum, ub.complete_txg), (42, 5, 11, 42));
    // A V2 copy that claims more than its txg is refused.
    let mut ub = ub;
    ub.complete_txg = 40;
    let mut bytes = ub.encode();
    bytes[176] = 43;
    let sum = ChecksumAlg::Xxh3_128.compute(&bytes[..UBERBLOCK_BYTES - 16]);
    bytes[UBERBLOCK_BYTES - 16..].copy_from_slice(&sum.0);
    assert!(matches!(
        Uberblock::decode(&bytes),
        Err(FormatError::Invalid { field: "complete_txg", .. })
    ));
}

#[test]
fn golden_label() {
    let bytes = sample_label().encode().unwrap();
    golden("label.bin", &bytes);
    assert_eq!(LabelHeader::decode(&bytes).unwrap(), sample_label());
    // A tree without RAID-Z needs no feature and is written as before V6, in a V1 label that
    // older builds read (label.bin has not changed since V1).
    assert!(sample_label().config.features().is_empty());
    assert_eq!(sample_label().config.version(), FormatVersion::V1);
    assert_eq!(bytes[8..10], [1, 0]);
}

/// A V6 label: its config holds a RAID-Z vdev (one of whose columns is being replaced) and
/// names the feature needed to read it.
#[test]
fn golden_label_v6() {
    let label = sample_raidz_label();
    assert_eq!(label.config.features(), ["raidz"]);
    assert_eq!(label.config.version(), FormatVersion::V6);
    let bytes = label.encode().unwrap();
    golden("label_v6.bin", &bytes);
    assert_eq!(bytes[8..10], [6, 0]);
    assert_eq!(LabelHeader::decode(&bytes).unwrap(), label);
}

/// A V6 label whose RAID-Z vdev lays out its log blocks as copies: the flag in the vdev's
/// flags byte, and the feature that makes a build that does not know the layout refuse it.
#[test]
fn golden_label_v6_log_copies() {
    let mut label = sample_raidz_label();
    label.config.top[0].raidz.as_mut().unwrap().log_copies = true;
    assert_eq!(label.config.features(), ["raidz", "raidz_log_copies"]);
    let bytes = label.encode().unwrap();
    golden("label_v6_log_copies.bin", &bytes);
    assert_eq!(LabelHeader::decode(&bytes).unwrap(), label);
}

/// The leaf layout: labels do not overlap each other or the data area, and uberblock slots
/// stay inside their label.
#[test]
fn layout_is_consistent() {
    let leaf = (1u64 << 30) + 12345 * 512;
    let offsets = label_offsets(leaf);
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[1], LABEL_BYTES);
    assert!(offsets[3] + LABEL_BYTES <= leaf);
    assert_eq!(offsets[2] + LABEL_BYTES, offsets[3]);
    assert!(DATA_START_BYTES <= offsets[2]);
    for txg in [0u64, 1, 127, 128, 1 << 40] {
        for &label in &offsets {
            let at = uberblock_offset(label, txg);
            assert!(
                at >= label + LABEL_HEADER_BYTES as u64
                    && at + UBERBLOCK_BYTES as u64 <= label + LABEL_BYTES
            );
        }
    }
}

#[test]
fn bad_inputs_name_the_problem() {
    let mut bytes = Uberblock {
        txg: 1,
        pool_guid: 1,
        guid_sum: 1,
        timestamp_secs: 1,
        root: None,
        complete_txg: 1,
    }
    .encode();
    assert!(matches!(Uberblock::decode(&bytes[..100]), Err(FormatError::Truncated { .. })));
    bytes[0] ^= 1;
    assert!(matches!(Uberblock::decode(&bytes), Err(FormatError::BadMagic { .. })));
    let mut label = sample_label();
    label.pool_name = "x".repeat(65);
    assert!(matches!(label.encode(), Err(FormatError::TooLarge { .. })));
    let mut label = sample_label();
    label.ashift = 30;
    assert!(matches!(label.encode(), Err(FormatError::Invalid { field: "ashift", .. })));
    let big = TopConfig {
        kind: TopKind::Mirror,
        log: false,
        guid: 1,
        children: (0..200)
            .map(|i| LeafConfig { guid: i, path: "/very/long/path/to/a/disk".into() })
            .collect(),
        raidz: None,
    };
    let mut label = sample_label();
    label.config.top.push(big);
    assert!(matches!(label.encode(), Err(FormatError::TooLarge { .. })));
}

#[test]
fn golden_space_map() {
    let map = SpaceMap {
        ashift: 12,
        synced_txg: 9,
        free: vec![(4 << 20, 1 << 20), (8 << 20, 4096)],
        deferred: vec![(8, 6 << 20, 8192)],
    };
    let bytes = map.encode().unwrap();
    golden("space_map.bin", &bytes);
    assert_eq!(SpaceMap::decode(&bytes).unwrap(), map);
    // Overlapping or unordered ranges are refused even with a valid checksum.
    let bad = SpaceMap { free: vec![(8192, 8192), (4096, 8192)], ..map };
    assert!(matches!(SpaceMap::decode(&bad.encode().unwrap()), Err(FormatError::Invalid { .. })));
}

#[test]
fn golden_directory() {
    let dir = PoolDirectory {
        txg: 12,
        next_volume_id: 3,
        space_maps: vec![vec![sample_bp(), sample_bp()], vec![]],
        volumes: vec![
            VolumeEntry {
                id: 1,
                name: "vm1".into(),
                size_bytes: 1 << 30,
                block_bytes: 16384,
                levels: 2,
                root: Some(sample_bp()),
                log: Some(LogHeader {
                    chain_id: 0x5eed,
                    head_sequence: 7,
                    replayed_record: 40,
                    claim_txg: 11,
                    head: sample_bp(),
                }),
                dedup: DedupMode::Verify,
                sync: SyncMode::Standard,
                logbias: LogBias::Latency,
                compression: Compression::Off,
                reservation_bytes: 0,
                space: None,
                prev_snap_txg: 0,
                origin: None,
                deadlist: Deadlist::default(),
                snapshots: Vec::new(),
                receive: None,
                key_family: 0,
                root_mac: [0; 32],
                snapshot_schedule: Vec::new(),
            },
            VolumeEntry {
                id: 2,
                name: "empty".into(),
                size_bytes: 1 << 20,
                block_bytes: 4096,
                levels: 1,
                root: None,
                log: None,
                dedup: DedupMode::Off,
                sync: SyncMode::Standard,
                logbias: LogBias::Latency,
                compression: Compression::Off,
                reservation_bytes: 0,
                space: None,
                prev_snap_txg: 0,
                origin: None,
                deadlist: Deadlist::default(),
                snapshots: Vec::new(),
                receive: None,
                key_family: 0,
                root_mac: [0; 32],
                snapshot_schedule: Vec::new(),
            },
        ],
        ddt: DdtHeader {
            salt: [0x5a; 32],
            bucket_bits: 6,
            levels: 1,
            entries: 10,
            references: 25,
            allocated_bytes: 40960,
            root: Some(sample_bp()),
        },
        records: None,
        key_families: Vec::new(),
        properties: None,
    };
    let bytes = dir.encode(512).unwrap();
    assert_eq!(bytes.len() % 512, 0);
    golden("directory.bin", &bytes);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), dir);
    let mut padded = bytes.clone();
    *padded.last_mut().unwrap() = 1;
    assert!(PoolDirectory::decode(&padded).is_err(), "padding must be zero");

    // V2: the same directory with the vdev tree, leaf records and a scan record. It is no
    // longer written, but a pool made then still opens.
    let mut v2 = dir.clone();
    v2.records = Some(sample_records());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/directory_v2.bin");
    assert_eq!(PoolDirectory::decode(&std::fs::read(path).unwrap()).unwrap(), v2);
    // V3 writes each volume's space figures; uncounted ones are refused, not written as zeros.
    assert!(matches!(v2.encode(512), Err(FormatError::Invalid { .. })));

    // V3: each volume's compression and space figures.
    let mut v3 = v2.clone();
    v3.volumes[0].compression = Compression::Zstd(19);
    v3.volumes[0].reservation_bytes = (1 << 30) + (17 << 20);
    v3.volumes[0].space = Some(VolumeSpace {
        referenced_bytes: 5 << 20,
        logical_bytes: 8 << 20,
        physical_bytes: 3 << 20,
    });
    v3.volumes[1].compression = Compression::Lz4;
    v3.volumes[1].space = Some(VolumeSpace::default());
    // V3 is no longer written; a pool made then still opens, with no snapshots.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/directory_v3.bin");
    assert_eq!(PoolDirectory::decode(&std::fs::read(path).unwrap()).unwrap(), v3);

    // V4: snapshots and dead lists.
    let mut v4 = v3.clone();
    let dead = Deadlist {
        entries: 1500,
        buckets: vec![(0, 1 << 20), (9, 3 << 20)],
        pieces: vec![sample_bp(), sample_bp()],
    };
    v4.volumes[0].prev_snap_txg = 11;
    v4.volumes[0].deadlist = dead.clone();
    v4.volumes[0].snapshots = vec![
        SnapshotEntry {
            id: 4,
            guid: 0x1234_5678_9abc_def0,
            name: "before-upgrade".into(),
            txg: 8,
            creation_secs: 1_795_000_000,
            size_bytes: 1 << 29,
            levels: 2,
            root: Some(sample_bp()),
            space: VolumeSpace {
                referenced_bytes: 4 << 20,
                logical_bytes: 6 << 20,
                physical_bytes: 2 << 20,
            },
            deadlist: Deadlist::default(),
            root_mac: [0; 32],
            automatic: false,
        },
        SnapshotEntry {
            id: 5,
            guid: 7,
            name: "daily".into(),
            txg: 11,
            creation_secs: 1_795_000_100,
            size_bytes: 1 << 30,
            levels: 2,
            root: None,
            space: VolumeSpace::default(),
            deadlist: dead,
            root_mac: [0; 32],
            automatic: false,
        },
    ];
    v4.volumes[1].origin = Some(Origin { snapshot: 4, txg: 8, referenced_bytes: 4 << 20 });
    v4.volumes[1].prev_snap_txg = 8;
    // V4 is no longer written; a pool made then still opens, with no receive state.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/directory_v4.bin");
    assert_eq!(PoolDirectory::decode(&std::fs::read(path).unwrap()).unwrap(), v4);

    // V5: the state of a receive that can be resumed.
    let mut v5 = v4.clone();
    v5.volumes[1].receive = Some(ReceiveState {
        to_guid: 0xfeed_f00d,
        from_guid: Some(7),
        next_block: 4096,
        source: "tank/db".into(),
    });
    let bytes = v5.encode(512).unwrap();
    golden("directory_v5.bin", &bytes);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), v5);
    assert_eq!(bytes[8..10], [5, 0], "a tree without RAID-Z keeps the directory at V5");

    // V6: the same with a RAID-Z vdev in the tree, whose config takes its V6 layout.
    let mut v6 = v5.clone();
    v6.records.as_mut().unwrap().config = sample_raidz_config();
    let bytes = v6.encode(512).unwrap();
    golden("directory_v6.bin", &bytes);
    assert_eq!(bytes[8..10], [6, 0]);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), v6);
    let mut full = v5.clone();
    full.volumes[1].receive.as_mut().unwrap().from_guid = None;
    assert_eq!(PoolDirectory::decode(&full.encode(512).unwrap()).unwrap(), full);
    // A receive state with guid 0 is not written.
    let mut zero = v5.clone();
    zero.volumes[1].receive.as_mut().unwrap().to_guid = 0;
    assert!(zero.encode(512).is_err());
    // Snapshots out of txg order, or newer than the volume's newest, are refused.
    let mut disordered = v4.clone();
    disordered.volumes[0].snapshots.swap(0, 1);
    assert!(PoolDirectory::decode(&disordered.encode(512).unwrap()).is_err());
    let mut ahead = v4.clone();
    ahead.volumes[0].prev_snap_txg = 10;
    assert!(PoolDirectory::decode(&ahead.encode(512).unwrap()).is_err());
    // A V1 directory has no place for snapshots.
    let mut v1 = dir.clone();
    v1.volumes[0].snapshots = v4.volumes[0].snapshots.clone();
    assert!(v1.encode(512).is_err());
    // No scan yet: the record is all zeros.
    let mut idle = v4.clone();
    idle.records.as_mut().unwrap().scan = None;
    assert_eq!(PoolDirectory::decode(&idle.encode(512).unwrap()).unwrap(), idle);
    // A V1 directory has no place for a compression property.
    let mut v1 = dir.clone();
    v1.volumes[1].compression = Compression::Lz4;
    assert!(v1.encode(512).is_err());
}

/// V7: an encrypted volume's key family and root MACs, its snapshots' root MACs, and the
/// pool's wrapped keys, written only when the config lists the `encryption` feature. An
/// encrypted volume in a directory without the feature, a V6 directory whose config lists it,
/// and a volume naming a family the directory lacks are refused.
#[test]
fn golden_directory_v7() {
    let mut v6 = PoolDirectory::decode(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/directory_v6.bin"),
        )
        .unwrap(),
    )
    .unwrap();
    let family = sluice_format::WrappedKey {
        guid: 0x00fa_0000_0000_0001,
        suite: sluice_format::CryptSuite::Aes256Gcm,
        format: sluice_format::KeyFormat::Passphrase,
        kdf: Some(sluice_format::Argon2Params {
            memory_kib: 65536,
            passes: 3,
            lanes: 1,
            salt: [0x5c; 16],
        }),
        location: sluice_format::KeyLocation::File("/etc/sluice/db.key".into()),
        iv: [0x21; 12],
        mac: [0x42; 16],
        wrapped: [0x84; 32],
    };
    // Not yet encrypted: the feature missing, an encrypted volume cannot be written.
    let mut unmarked = v6.clone();
    unmarked.volumes[0].key_family = family.guid;
    unmarked.key_families = vec![family.clone()];
    assert!(unmarked.encode(512).is_err(), "key families need the encryption feature");
    let mut v7 = v6.clone();
    v7.records.as_mut().unwrap().config.encryption = true;
    v7.key_families = vec![
        family.clone(),
        sluice_format::WrappedKey {
            guid: 0x00fa_0000_0000_0002,
            format: sluice_format::KeyFormat::Raw,
            kdf: None,
            location: sluice_format::KeyLocation::Prompt,
            ..family.clone()
        },
    ];
    v7.volumes[0].key_family = family.guid;
    v7.volumes[0].root_mac = [0x77; 32];
    v7.volumes[0].snapshots[0].root_mac = [0x78; 32];
    v7.volumes[0].snapshots[1].root_mac = [0x79; 32];
    let bytes = v7.encode(512).unwrap();
    golden("directory_v7.bin", &bytes);
    assert_eq!(bytes[8..10], [7, 0]);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), v7);
    // A pool with the feature but no family left still writes V7.
    let mut empty = v7.clone();
    empty.key_families.clear();
    empty.volumes[0].key_family = 0;
    assert_eq!(PoolDirectory::decode(&empty.encode(512).unwrap()).unwrap(), empty);
    // A volume naming a family that is not there.
    let mut orphan = v7.clone();
    orphan.volumes[1].key_family = 0xdead;
    assert!(PoolDirectory::decode(&orphan.encode(512).unwrap()).is_err());
    // A V6 directory whose config lists the feature: written by no build, refused.
    let mut bytes = v7.encode(512).unwrap();
    bytes[8] = 6;
    assert!(PoolDirectory::decode(&bytes).is_err());
    // The earlier directories are written as they were.
    v6.key_families.clear();
    assert_eq!(v6.encode(512).unwrap()[8..10], [6, 0]);
}

/// V8: the pool's properties, each volume's snapshot schedule and which snapshots it took,
/// written only when the config lists `pool_properties`; encrypted or not (V7's fields are
/// there, zero for a pool without encryption). Refused: schedules or properties without the
/// feature, a V7 or V6 directory whose config lists it, a V8 one whose config does not, a
/// schedule naming a period twice or keeping 0, and unknown flag bits.
#[test]
fn golden_directory_v8() {
    let v6 = PoolDirectory::decode(
        &std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/directory_v6.bin"),
        )
        .unwrap(),
    )
    .unwrap();
    let schedule = vec![
        ScheduleRule { period: SchedulePeriod::Hourly, keep: 24 },
        ScheduleRule { period: SchedulePeriod::Daily, keep: 30 },
        ScheduleRule { period: SchedulePeriod::Weekly, keep: 8 },
    ];
    let properties = PoolProperties {
        autoreplace: true,
        scrub_interval_secs: 7 * 86_400,
        last_scrub_end_secs: 1_795_000_200,
    };
    // Without the feature none of it can be written.
    let mut unmarked = v6.clone();
    unmarked.volumes[0].snapshot_schedule = schedule.clone();
    assert!(unmarked.encode(512).is_err(), "a schedule needs the pool_properties feature");
    let mut unmarked = v6.clone();
    unmarked.properties = Some(properties);
    assert!(unmarked.encode(512).is_err(), "properties need the pool_properties feature");
    let mut v8 = v6.clone();
    v8.records.as_mut().unwrap().config.properties = true;
    v8.properties = Some(properties);
    v8.volumes[0].snapshot_schedule = schedule.clone();
    v8.volumes[0].snapshots[1].automatic = true;
    let bytes = v8.encode(512).unwrap();
    golden("directory_v8.bin", &bytes);
    assert_eq!(bytes[8..10], [8, 0]);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), v8);
    // The feature without properties is not written.
    let mut bare = v8.clone();
    bare.properties = None;
    assert!(bare.encode(512).is_err());
    // Encrypted too: the key families ride along.
    let mut both = v8.clone();
    both.records.as_mut().unwrap().config.encryption = true;
    assert_eq!(PoolDirectory::decode(&both.encode(512).unwrap()).unwrap(), both);
    // Versions and features must agree.
    for version in [6u8, 7] {
        let mut bytes = v8.encode(512).unwrap();
        bytes[8] = version;
        assert!(PoolDirectory::decode(&bytes).is_err(), "V{version} with pool_properties");
    }
    // Bad schedules are refused both ways.
    for bad in [
        vec![ScheduleRule { period: SchedulePeriod::Daily, keep: 0 }],
        vec![ScheduleRule { period: SchedulePeriod::Daily, keep: SCHEDULE_KEEP_MAX + 1 }],
        vec![
            ScheduleRule { period: SchedulePeriod::Daily, keep: 3 },
            ScheduleRule { period: SchedulePeriod::Daily, keep: 4 },
        ],
    ] {
        let mut wrong = v8.clone();
        wrong.volumes[1].snapshot_schedule = bad;
        assert!(wrong.encode(512).is_err());
    }
    // Flag bits this build does not know, in the properties and in a snapshot.
    let mut bytes = v8.encode(512).unwrap();
    let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    bytes[len - 24] |= 0x80;
    assert!(PoolDirectory::decode(&bytes).is_err(), "unknown pool property flag");
    // A snapshot's flags byte is zero-checked before V8: a V7 directory with the automatic
    // bit set is refused (found by flipping the byte after `levels` of the second snapshot).
    let v7_bytes = {
        let mut v7 = v6.clone();
        v7.records.as_mut().unwrap().config.encryption = true;
        v7.encode(512).unwrap()
    };
    let name = b"daily";
    let at = v7_bytes.windows(name.len()).position(|w| w == name).unwrap();
    let mut flagged = v7_bytes.clone();
    flagged[at - 3] = 1;
    assert!(PoolDirectory::decode(&flagged).is_err(), "a snapshot flag in a V7 directory");
}

/// The compression property's names and codes.
#[test]
fn compression_property() {
    for (text, value) in [
        ("off", Compression::Off),
        ("lz4", Compression::Lz4),
        ("on", Compression::Lz4),
        ("zstd", Compression::Zstd(3)),
        ("zstd-1", Compression::Zstd(1)),
        ("zstd-19", Compression::Zstd(19)),
    ] {
        assert_eq!(Compression::parse(text), Some(value), "{text}");
        assert_eq!(Compression::parse(&value.name()), Some(value));
    }
    for bad in ["zstd-0", "zstd-20", "gzip", "", "zstd-", "LZ4"] {
        assert_eq!(Compression::parse(bad), None, "{bad} accepted");
    }
}

/// A compressed block pointer round-trips, a data block's or an indirect block's; a pool
/// metadata block's, or one that claims to save nothing, is refused.
#[test]
fn compressed_block_pointer() {
    let mut bp = sample_bp();
    bp.compression = BlockCompression::Lz4;
    bp.lsize_sectors = 32;
    bp.psize_sectors = 8;
    let bytes = BlockPointer::encode(Some(&bp));
    assert_eq!(BlockPointer::decode(&bytes).unwrap(), Some(bp));
    let mut indirect = bp;
    (indirect.kind, indirect.level) = (BlockKind::Indirect, 1);
    assert_eq!(
        BlockPointer::decode(&BlockPointer::encode(Some(&indirect))).unwrap(),
        Some(indirect)
    );
    let mut metadata = bp;
    metadata.kind = BlockKind::Metadata;
    assert!(BlockPointer::decode(&BlockPointer::encode(Some(&metadata))).is_err());
    bp.psize_sectors = 32;
    let bytes = BlockPointer::encode(Some(&bp));
    assert!(BlockPointer::decode(&bytes).is_err());
    let mut bytes = BlockPointer::encode(Some(&sample_bp()));
    bytes[65] = 3;
    assert!(BlockPointer::decode(&bytes).is_err(), "unknown compression accepted");
}

fn sample_records() -> DirectoryRecords {
    DirectoryRecords {
        config: sample_label().config,
        leaves: vec![
            LeafRecord {
                guid: 0x1111,
                state: LeafRecordState::Online,
                replaced_by: 0x3333,
                read_errors: 0,
                write_errors: 2,
                checksum_errors: 3,
            },
            LeafRecord {
                guid: 0x2222,
                state: LeafRecordState::Faulted,
                replaced_by: 0,
                read_errors: 11,
                write_errors: 0,
                checksum_errors: 0,
            },
        ],
        scan: Some(ScanRecord {
            kind: ScanKind::Resilver,
            phase: ScanRecordPhase::Scanning,
            paused: false,
            bookmark: ScanBookmark::Volume { id: 2, block: 4096 },
            min_birth: 7,
            max_birth: 30,
            start_secs: 1_700_000_000,
            end_secs: 0,
            run_secs: 12,
            examined_bytes: 1 << 30,
            total_bytes: 4 << 30,
            issued_blocks: 8192,
            issued_bytes: 1 << 29,
            repaired_copies: 8000,
            repaired_bytes: 1 << 29,
            errors: 1,
            unrecoverable: 0,
            targets: vec![0x3333],
        }),
    }
}

/// Every record field that is out of range, and every reserved byte set, is refused.
#[test]
fn directory_records_refuse_bad_fields() {
    let mut dir = PoolDirectory { records: Some(sample_records()), ..PoolDirectory::default() };
    dir.ddt.bucket_bits = 6;
    dir.ddt.levels = 1;
    let good = dir.encode(512).unwrap();
    PoolDirectory::decode(&good).unwrap();
    let len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let scan_at = len - 12 - 128;
    let leaves_at = scan_at - 2 * 48;
    for (at, value) in [
        (leaves_at + 8, 4u8), // leaf state
        (leaves_at + 9, 2),   // flags
        (leaves_at + 10, 1),  // reserved
        (scan_at, 3),         // scan func
        (scan_at + 1, 3),     // scan phase
        (scan_at + 2, 2),     // paused
        (scan_at + 3, 4),     // bookmark kind
        (scan_at + 4, 1),     // reserved
    ] {
        let mut bad = good.clone();
        bad[at] = value;
        assert!(PoolDirectory::decode(&bad).is_err(), "byte {at} = {value} was accepted");
    }
}

#[test]
fn golden_dedup_bucket() {
    let key = |first: u8| {
        let mut k = [first; 32];
        k[1] = 0x77;
        DdtKey(k)
    };
    // Bucket 1 of a 2-bit table holds the keys starting with binary 01.
    let bucket = DdtBucket {
        index: 1,
        bucket_bits: 2,
        entries: vec![
            DdtEntry { key: key(0x40), refcount: 1, bp: sample_dedup_bp(key(0x40)) },
            DdtEntry { key: key(0x7f), refcount: 9, bp: sample_dedup_bp(key(0x7f)) },
        ],
    };
    let bytes = bucket.encode(512).unwrap();
    golden("ddt_bucket.bin", &bytes);
    assert_eq!(DdtBucket::decode(&bytes).unwrap(), bucket);
    for entry in &bucket.entries {
        assert_eq!(DdtBucket::find(&bytes, &entry.key).unwrap(), Some(*entry));
    }
    assert_eq!(DdtBucket::find(&bytes, &key(0x41)).unwrap(), None);
    assert_eq!(DdtBucket::find(&bytes, &key(0x00)).unwrap(), None);
    assert_eq!(DdtBucket::find(&bytes, &key(0xff)).unwrap(), None);
    assert_eq!(key(0x7f).bucket(2), 1);
    assert_eq!(key(0xc0).bucket(2), 3);
    assert_eq!(key(0xc0).bucket(0), 0);
    // What a bucket must never hold is refused both ways.
    let wrong_bucket = DdtBucket {
        entries: vec![DdtEntry { key: key(0xc0), refcount: 1, bp: sample_dedup_bp(key(0xc0)) }],
        ..bucket.clone()
    };
    assert!(wrong_bucket.encode(512).is_err());
    let zero_refs = DdtBucket {
        entries: vec![DdtEntry { key: key(0x40), refcount: 0, bp: sample_dedup_bp(key(0x40)) }],
        ..bucket.clone()
    };
    assert!(zero_refs.encode(512).is_err());
    let unsorted =
        DdtBucket { entries: bucket.entries.iter().rev().copied().collect(), ..bucket.clone() };
    assert!(unsorted.encode(512).is_err());
    let mut zero_refs_on_disk = bytes.clone();
    zero_refs_on_disk[32 + 32..32 + 40].fill(0);
    assert!(matches!(
        DdtBucket::decode(&zero_refs_on_disk),
        Err(FormatError::Invalid { field: "refcount", .. })
    ));
}

#[test]
fn dedup_flag_round_trips_and_unknown_flags_are_refused() {
    let bp = sample_dedup_bp(DdtKey([3; 32]));
    let bytes = BlockPointer::encode(Some(&bp));
    assert_eq!(BlockPointer::decode(&bytes).unwrap(), Some(bp));
    let mut bad = bytes;
    bad[68] = 2;
    assert!(BlockPointer::decode(&bad).is_err());
    let mut stray_key = BlockPointer::encode(Some(&sample_bp()));
    stray_key[100] = 1;
    assert!(BlockPointer::decode(&stray_key).is_err());
}

fn arb_dva() -> impl Strategy<Value = Dva> {
    (0u32..64, 1u32..65536, 0u64..1 << 40).prop_map(|(vdev, asize_sectors, offset_sectors)| Dva {
        vdev,
        asize_sectors,
        offset_sectors,
    })
}

fn arb_bp() -> impl Strategy<Value = BlockPointer> {
    (
        arb_dva(),
        proptest::option::of(arb_dva()),
        proptest::option::of(arb_dva()),
        (
            1u32..4096,
            1u32..4096,
            any::<u64>(),
            0u8..4,
            any::<u8>(),
            any::<u64>(),
            any::<[u8; 16]>(),
        ),
        proptest::option::of(any::<[u8; 32]>()),
    )
        .prop_map(
            |(
                d0,
                d1,
                d2,
                (lsize_sectors, psize_sectors, birth_txg, kind, level, fill, sum),
                key,
            )| {
                BlockPointer {
                    dvas: [d0, d1.unwrap_or_default(), d2.unwrap_or_default()],
                    lsize_sectors,
                    psize_sectors,
                    birth_txg,
                    checksum_alg: ChecksumAlg::Xxh3_128,
                    compression: BlockCompression::None,
                    kind: [
                        BlockKind::None,
                        BlockKind::Data,
                        BlockKind::Indirect,
                        BlockKind::Metadata,
                    ][kind as usize],
                    level,
                    fill,
                    checksum: Checksum(sum),
                    dedup: key.map(DdtKey),
                    crypt: sluice_format::BlockCrypt::None,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn block_pointers_round_trip(bp in arb_bp()) {
        let bytes = BlockPointer::encode(Some(&bp));
        prop_assert_eq!(BlockPointer::decode(&bytes).unwrap(), Some(bp));
    }

    #[test]
    fn uberblocks_round_trip(txg: u64, pool_guid: u64, guid_sum: u64, timestamp_secs: u64, root in proptest::option::of(arb_bp()), behind: u64) {
        let complete_txg = txg.saturating_sub(behind);
        let ub = Uberblock { txg, pool_guid, guid_sum, timestamp_secs, root, complete_txg };
        prop_assert_eq!(Uberblock::decode(&ub.encode()).unwrap(), ub);
    }

    /// Any bit flipped anywhere in an uberblock or label header is detected.
    #[test]
    fn bit_flips_are_detected(bit in 0usize..(UBERBLOCK_BYTES * 8), label_bit in 0usize..(LABEL_HEADER_BYTES * 8)) {
        let mut ub = Uberblock { txg: 3, pool_guid: 4, guid_sum: 5, timestamp_secs: 6, root: Some(sample_bp()), complete_txg: 2 }.encode();
        ub[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(Uberblock::decode(&ub).is_err());
        let mut label = sample_label().encode().unwrap();
        label[label_bit / 8] ^= 1 << (label_bit % 8);
        prop_assert!(LabelHeader::decode(&label).is_err());
        let mut label = sample_raidz_label().encode().unwrap();
        label[label_bit / 8] ^= 1 << (label_bit % 8);
        prop_assert!(LabelHeader::decode(&label).is_err());
    }

    /// Decoders return an error or a value for any input; they never panic.
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = BlockPointer::decode(&bytes);
        let _ = Uberblock::decode(&bytes);
        let _ = LabelHeader::decode(&bytes);
        let _ = SpaceMap::decode(&bytes);
        let _ = PoolDirectory::decode(&bytes);
        let mut v2 = bytes.clone();
        if v2.len() >= 16 {
            v2[..8].copy_from_slice(b"SLUICEDR");
            v2[8] = 2;
            v2[9] = 0;
        }
        let _ = PoolDirectory::decode(&v2);
        let _ = DdtBucket::decode(&bytes);
        let _ = DdtBucket::find(&bytes, &DdtKey([0x40; 32]));
        let _ = VdevTreeConfig::decode(&bytes, FormatVersion::V1);
        let _ = VdevTreeConfig::decode(&bytes, FormatVersion::V6);
        // The same behind a feature list this build knows, so the tree itself is read.
        let mut v6 = b"\x01\x05raidz".to_vec();
        v6.extend_from_slice(&bytes);
        let _ = VdevTreeConfig::decode(&v6, FormatVersion::V6);
    }

    /// Label headers whose checksum was recomputed over random contents (as a buggy writer or
    /// a crafted image would produce) still decode without panicking.
    #[test]
    fn checksummed_garbage_never_panics(body in proptest::collection::vec(any::<u8>(), LABEL_HEADER_BYTES - 16), version in prop::sample::select(vec![1u8, 6])) {
        let mut bytes = body.clone();
        bytes[..8].copy_from_slice(b"SLUICELB");
        bytes[8] = version;
        bytes[9] = 0;
        bytes[10] = 1;
        let sum = ChecksumAlg::Xxh3_128.compute(&bytes);
        bytes.extend_from_slice(&sum.0);
        let _ = LabelHeader::decode(&bytes);
    }
}

/// The properties byte of a volume entry (offset 21): dedup in bits 0-1, sync in 2-3, logbias
/// in 4. A pool written before sync and logbias existed has zeros there, which decode as
/// sync=standard and logbias=latency (the golden directory above); unknown bits are refused.
#[test]
fn volume_properties_byte() {
    let volume = VolumeEntry {
        id: 1,
        name: "v".into(),
        size_bytes: 1 << 20,
        block_bytes: 16384,
        levels: 1,
        root: None,
        log: None,
        dedup: DedupMode::On,
        sync: SyncMode::Disabled,
        logbias: LogBias::Throughput,
        compression: Compression::Off,
        reservation_bytes: 0,
        space: None,
        prev_snap_txg: 0,
        origin: None,
        deadlist: Deadlist::default(),
        snapshots: Vec::new(),
        receive: None,
        key_family: 0,
        root_mac: [0; 32],
        snapshot_schedule: Vec::new(),
    };
    let dir = PoolDirectory { volumes: vec![volume], ..PoolDirectory::default() };
    let mut bytes = dir.encode(4096).unwrap();
    // Header (40 bytes), no space maps, then the volume: byte 21 of its entry.
    let at = 40 + 21;
    assert_eq!(bytes[at], 1 | 2 << 2 | 1 << 4);
    assert_eq!(PoolDirectory::decode(&bytes).unwrap(), dir);
    for bad in [0x20u8, 3 << 2, 3] {
        bytes[at] = bad;
        assert!(PoolDirectory::decode(&bytes).is_err(), "properties byte {bad:#x} accepted");
    }
}

/// A dead list piece: its pointers, refused when the count overruns the block or a slot is a
/// hole.
#[test]
fn golden_deadlist_piece() {
    let piece = DeadlistPiece { entries: vec![sample_bp(); 3] };
    let bytes = piece.encode(4096).unwrap();
    assert_eq!(bytes.len(), 4096);
    golden("deadlist_piece.bin", &bytes);
    assert_eq!(DeadlistPiece::decode(&bytes).unwrap(), piece);
    let mut long = bytes.clone();
    long[12] = 4;
    assert!(DeadlistPiece::decode(&long).is_err(), "a count past the entries");
    let full = DeadlistPiece { entries: vec![sample_bp(); DEADLIST_PIECE_ENTRIES] };
    assert_eq!(full.encode(4096).unwrap().len(), DEADLIST_PIECE_BYTES);
    let over = DeadlistPiece { entries: vec![sample_bp(); DEADLIST_PIECE_ENTRIES + 1] };
    assert!(over.encode(4096).is_err());
}
