//! The vdev tree config's V6 layout (RAID-Z vdevs and the features needed to read them): it
//! round-trips for every RAID-Z shape there is, matches label.rs's byte table written out by
//! hand here, refuses every out-of-range field by name on both sides and a feature it does not
//! know by name, and has room for a RAID-Z vdev of 64 children with realistic paths. The
//! golden bytes of a V6 label and directory are in format.rs, with the others.

use sluice_format::raidz::{RAIDZ_CHILDREN_MAX, RAIDZ_PARITY_MAX};
use sluice_format::{
    feature_description, ChecksumAlg, FormatError, FormatVersion, LabelHeader, LeafConfig,
    RaidzConfig, TopConfig, TopKind, VdevTreeConfig, CONFIG_BYTES_MAX, DATA_START_BYTES,
    FEATURES_KNOWN, FEATURES_UPGRADABLE, LABEL_HEADER_BYTES, LABEL_VERSION,
};

/// Where each RAID-Z child's data area ends in these tests (a 1 GiB leaf's, roughly).
const END: u64 = 1 << 30;

fn child(i: u16) -> LeafConfig {
    LeafConfig { guid: 100 + u64::from(i), path: format!("/dev/r{i}") }
}

fn replacement(column: u16) -> LeafConfig {
    LeafConfig { guid: 200 + u64::from(column), path: format!("/dev/new{column}") }
}

fn raidz_top(parity: u8, width: u16, replacing: &[u16]) -> TopConfig {
    TopConfig {
        kind: TopKind::Raidz,
        log: false,
        guid: 7,
        children: (0..width).map(child).collect(),
        raidz: Some(RaidzConfig {
            parity,
            child_end_bytes: END,
            replacing: replacing.iter().map(|&c| (c, replacement(c))).collect(),
            log_copies: false,
        }),
    }
}

fn raidz_tree(parity: u8, width: u16, replacing: &[u16]) -> VdevTreeConfig {
    VdevTreeConfig {
        top: vec![raidz_top(parity, width, replacing)],
        encryption: false,
        properties: false,
        spares: Vec::new(),
        lz4_indirect: false,
    }
}

/// A V6 config of one RAID-Z vdev, written field by field from label.rs's byte table rather
/// than by the encoder: the encoder is checked against it, and decode is given what no
/// encoder writes.
#[derive(Clone)]
struct Raw {
    features: Vec<&'static str>,
    kind: u8,
    parity: u8,
    reserved: u8,
    child_end_bytes: u64,
    width: u16,
    replacing: Vec<u16>,
}

impl Raw {
    /// The bytes of `raidz_tree(2, 6, &[3])`.
    fn good() -> Raw {
        Raw {
            features: vec!["raidz"],
            kind: 2,
            parity: 2,
            reserved: 0,
            child_end_bytes: END,
            width: 6,
            replacing: vec![3],
        }
    }

    fn bytes(&self) -> Vec<u8> {
        fn leaf(out: &mut Vec<u8>, leaf: &LeafConfig) {
            out.extend_from_slice(&leaf.guid.to_le_bytes());
            out.extend_from_slice(&(leaf.path.len() as u16).to_le_bytes());
            out.extend_from_slice(leaf.path.as_bytes());
        }
        let mut out = vec![self.features.len() as u8];
        for name in &self.features {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
        out.extend_from_slice(&1u16.to_le_bytes());
        out.push(self.kind);
        out.extend_from_slice(&7u64.to_le_bytes());
        out.push(self.parity);
        out.push(self.reserved);
        out.extend_from_slice(&self.child_end_bytes.to_le_bytes());
        out.extend_from_slice(&self.width.to_le_bytes());
        for i in 0..self.width {
            leaf(&mut out, &child(i));
        }
        out.push(self.replacing.len() as u8);
        for &column in &self.replacing {
            out.extend_from_slice(&column.to_le_bytes());
            leaf(&mut out, &replacement(column));
        }
        out
    }
}

fn invalid_field(result: Result<impl std::fmt::Debug, FormatError>) -> &'static str {
    match result {
        Err(FormatError::Invalid { field, .. }) => field,
        other => panic!("expected FormatError::Invalid, got {other:?}"),
    }
}

/// A label header's bytes with its config replaced by `config` (at the V6 version) and the
/// checksum recomputed, as a newer or buggy writer would leave them.
fn label_with_config(config: &[u8]) -> Vec<u8> {
    let label = LabelHeader {
        ashift: 12,
        pool_guid: 1,
        leaf_guid: 100,
        top_guid: 7,
        config_txg: 4,
        leaf_bytes: 1 << 31,
        pool_name: "tank".into(),
        config: raidz_tree(2, 6, &[3]),
    };
    let mut bytes = label.encode().expect("a valid label").to_vec();
    assert_eq!(bytes[8..10], [6, 0], "a RAID-Z tree's label is V6");
    bytes[124..128].copy_from_slice(&(config.len() as u32).to_le_bytes());
    bytes[128..LABEL_HEADER_BYTES - 16].fill(0);
    bytes[128..128 + config.len()].copy_from_slice(config);
    rechecksum(&mut bytes);
    bytes
}

fn rechecksum(label: &mut [u8]) {
    let sum = ChecksumAlg::Xxh3_128.compute(&label[..LABEL_HEADER_BYTES - 16]);
    label[LABEL_HEADER_BYTES - 16..].copy_from_slice(&sum.0);
}

#[test]
fn the_encoder_follows_the_byte_table() {
    let encoded = raidz_tree(2, 6, &[3]).encode().expect("a valid tree");
    assert_eq!(encoded, Raw::good().bytes());
    // Log blocks laid out as copies: bit 0 of the flags byte, and the feature listed.
    let mut copies = raidz_tree(2, 6, &[3]);
    copies.top[0].raidz.as_mut().expect("a RAID-Z vdev").log_copies = true;
    let raw = Raw { features: vec!["raidz", "raidz_log_copies"], reserved: 1, ..Raw::good() };
    assert_eq!(copies.encode().expect("a valid tree"), raw.bytes());
    assert_eq!(VdevTreeConfig::decode(&raw.bytes(), FormatVersion::V6).expect("decodes"), copies);
    assert_eq!(
        FEATURES_KNOWN,
        [
            "raidz",
            "encryption",
            "raidz_log_copies",
            "pool_properties",
            "spares",
            "hole_vdevs",
            "lz4_indirect"
        ]
    );
}

/// `pool upgrade` enables only features this build knows, every known feature has a line for
/// `pool upgrade -v`, and a config made without lz4_indirect gets it from `upgraded`, which
/// changes nothing else.
#[test]
fn upgradable_features_are_known_and_described() {
    for name in FEATURES_KNOWN {
        assert!(feature_description(name).is_some(), "{name} has no description");
    }
    assert!(FEATURES_UPGRADABLE.iter().all(|f| FEATURES_KNOWN.contains(f)));
    assert_eq!(feature_description("zstd_indirect"), None);
    let old = raidz_tree(1, 4, &[]);
    assert_eq!(old.features_disabled(), ["lz4_indirect"]);
    let new = old.upgraded();
    assert!(new.features_disabled().is_empty());
    assert_eq!(new.features(), ["raidz", "lz4_indirect"]);
    assert_eq!(VdevTreeConfig { lz4_indirect: false, ..new.clone() }, old);
    let decoded = VdevTreeConfig::decode(&new.encode().expect("encodes"), FormatVersion::V6);
    assert_eq!(decoded.expect("decodes"), new);
}

/// A pool with encrypted volumes lists the `encryption` feature in every label, whatever its
/// vdevs: the config is then in its V6 layout, and the flag survives a round trip.
#[test]
fn encryption_is_a_feature_of_the_config() {
    let mut tree = raidz_tree(1, 4, &[]);
    tree.top[0] = TopConfig {
        kind: TopKind::Mirror,
        log: false,
        guid: 7,
        children: vec![child(0), child(1)],
        raidz: None,
    };
    assert_eq!(tree.version(), FormatVersion::V1);
    tree.encryption = true;
    assert_eq!((tree.features(), tree.version()), (vec!["encryption"], FormatVersion::V6));
    let bytes = tree.encode().expect("a valid tree");
    assert_eq!(&bytes[..12], b"\x01\x0aencryption");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), tree);
    let both = VdevTreeConfig { encryption: true, ..raidz_tree(2, 6, &[]) };
    assert_eq!(both.features(), ["raidz", "encryption"]);
    let bytes = both.encode().expect("a valid tree");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), both);
    // Pool properties (a V8 directory) are a feature of the config in the same way.
    tree.encryption = false;
    tree.properties = true;
    assert_eq!((tree.features(), tree.version()), (vec!["pool_properties"], FormatVersion::V6));
    let bytes = tree.encode().expect("a valid tree");
    assert_eq!(&bytes[..17], b"\x01\x0fpool_properties");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), tree);
}

/// Every RAID-Z shape there is round-trips, alone and beside a mirror and a log leaf, bare and
/// with its first and last columns being replaced; one child too few or too many is refused.
#[test]
fn every_raidz_shape_round_trips() {
    let others = [
        TopConfig {
            kind: TopKind::Mirror,
            log: false,
            guid: 8,
            children: vec![child(900), child(901)],
            raidz: None,
        },
        TopConfig {
            kind: TopKind::Leaf,
            log: true,
            guid: 9,
            children: vec![child(902)],
            raidz: None,
        },
    ];
    for parity in 1..=RAIDZ_PARITY_MAX as u8 {
        for width in u16::from(parity) + 2..=RAIDZ_CHILDREN_MAX as u16 {
            for replacing in [&[][..], &[0, width - 1]] {
                let mut tree = raidz_tree(parity, width, replacing);
                tree.top.extend(others.iter().cloned());
                assert_eq!(tree.version(), FormatVersion::V6);
                let bytes = tree.encode().expect("a valid tree");
                let back = VdevTreeConfig::decode(&bytes, FormatVersion::V6);
                assert_eq!(back.expect("decodes"), tree, "raidz{parity} of {width}");
            }
        }
        for width in [u16::from(parity) + 1, RAIDZ_CHILDREN_MAX as u16 + 1] {
            let tree = raidz_tree(parity, width, &[]);
            assert_eq!(invalid_field(tree.encode()), "raidz child_count", "raidz{parity}/{width}");
            let raw = Raw { parity, width, replacing: vec![], ..Raw::good() };
            let decoded = VdevTreeConfig::decode(&raw.bytes(), FormatVersion::V6);
            assert_eq!(invalid_field(decoded), "raidz child_count", "raidz{parity}/{width}");
        }
    }
    // And through a label, which says V6.
    let label = LabelHeader {
        ashift: 12,
        pool_guid: 1,
        leaf_guid: 100,
        top_guid: 7,
        config_txg: 4,
        leaf_bytes: 1 << 31,
        pool_name: "tank".into(),
        config: raidz_tree(3, 64, &[5]),
    };
    let bytes = label.encode().expect("a valid label");
    assert_eq!(bytes[8..10], [6, 0]);
    assert_eq!(LabelHeader::decode(&bytes).expect("decodes"), label);
}

/// Each field of a RAID-Z vdev out of range is refused by decode, naming the field.
#[test]
fn decode_refuses_each_bad_raidz_field() {
    let decode = |raw: Raw| VdevTreeConfig::decode(&raw.bytes(), FormatVersion::V6);
    let good = Raw::good();
    assert_eq!(decode(good.clone()).expect("decodes"), raidz_tree(2, 6, &[3]));
    let cases = [
        (Raw { parity: 0, ..good.clone() }, "raidz parity"),
        (Raw { parity: 4, ..good.clone() }, "raidz parity"),
        (Raw { parity: 3, width: 4, replacing: vec![], ..good.clone() }, "raidz child_count"),
        (Raw { width: 65, ..good.clone() }, "raidz child_count"),
        (Raw { replacing: vec![6], ..good.clone() }, "raidz replacing column"),
        (Raw { replacing: vec![u16::MAX], ..good.clone() }, "raidz replacing column"),
        (Raw { replacing: vec![1, 4, 1], ..good.clone() }, "raidz replacing column (listed twice)"),
        (Raw { reserved: 2, ..good.clone() }, "raidz flags"),
        (Raw { reserved: 0x81, ..good.clone() }, "raidz flags"),
        // Log blocks laid out as copies, without the feature that says so.
        (Raw { reserved: 1, ..good.clone() }, "features (a tree without the features it uses)"),
        (Raw { child_end_bytes: DATA_START_BYTES, ..good.clone() }, "raidz child_end_bytes"),
        (Raw { child_end_bytes: 0, ..good.clone() }, "raidz child_end_bytes"),
        (Raw { kind: 0x82, ..good.clone() }, "log (a RAID-Z vdev cannot be a log device)"),
        (Raw { kind: 4, ..good.clone() }, "kind"),
        (
            Raw { features: vec![], ..good.clone() },
            "features (a tree without the features it uses)",
        ),
        (Raw { features: vec!["raidz", "raidz"], ..good.clone() }, "feature name (listed twice)"),
        (Raw { features: vec![""], ..good.clone() }, "feature name"),
        (Raw { features: vec!["raïdz"], ..good.clone() }, "feature name"),
    ];
    for (raw, field) in cases {
        assert_eq!(invalid_field(decode(raw)), field);
    }
    let mut trailing = good.bytes();
    trailing.push(0);
    assert_eq!(
        invalid_field(VdevTreeConfig::decode(&trailing, FormatVersion::V6)),
        "trailing bytes"
    );
    // Cut anywhere, it is truncated, never misread.
    let bytes = good.bytes();
    for len in 0..bytes.len() {
        let cut = VdevTreeConfig::decode(&bytes[..len], FormatVersion::V6);
        assert!(matches!(cut, Err(FormatError::Truncated { .. })), "cut at {len}: {cut:?}");
    }
}

/// A V1 config has no RAID-Z: kind 2 there is refused, and so are V6 bytes read as V1.
#[test]
fn a_v1_config_holds_no_raidz() {
    let tree = VdevTreeConfig {
        top: vec![TopConfig {
            kind: TopKind::Mirror,
            log: false,
            guid: 7,
            children: vec![child(0), child(1)],
            raidz: None,
        }],
        encryption: false,
        properties: false,
        spares: Vec::new(),
        lz4_indirect: false,
    };
    assert_eq!(tree.version(), FormatVersion::V1);
    let mut bytes = tree.encode().expect("a valid tree");
    for version in [FormatVersion::V1, FormatVersion::V5] {
        assert_eq!(VdevTreeConfig::decode(&bytes, version).expect("decodes"), tree);
    }
    bytes[2] = 2; // top_count u16, then the kind byte
    for version in [FormatVersion::V1, FormatVersion::V5] {
        assert_eq!(invalid_field(VdevTreeConfig::decode(&bytes, version)), "kind");
    }
    assert!(VdevTreeConfig::decode(&Raw::good().bytes(), FormatVersion::V1).is_err());
    // A V6 config that lists no feature and holds no RAID-Z is read, though none is written.
    let mut v6 = vec![0u8];
    v6.extend_from_slice(&tree.encode().expect("a valid tree"));
    assert_eq!(VdevTreeConfig::decode(&v6, FormatVersion::V6).expect("decodes"), tree);
}

/// Encode refuses what decode would: nothing is written that cannot be read back.
#[test]
fn encode_refuses_each_bad_raidz_field() {
    let with = |change: &dyn Fn(&mut TopConfig)| {
        let mut tree = raidz_tree(2, 6, &[3]);
        change(&mut tree.top[0]);
        invalid_field(tree.encode())
    };
    fn shape(top: &mut TopConfig) -> &mut RaidzConfig {
        top.raidz.as_mut().expect("a RAID-Z vdev's shape")
    }
    assert_eq!(with(&|t| shape(t).parity = 0), "raidz parity");
    assert_eq!(with(&|t| shape(t).parity = 4), "raidz parity");
    assert_eq!(with(&|t| t.children.truncate(3)), "raidz child_count");
    assert_eq!(with(&|t| shape(t).replacing = vec![(6, child(6))]), "raidz replacing column");
    assert_eq!(
        with(&|t| shape(t).replacing = vec![(1, child(7)), (1, child(8))]),
        "raidz replacing column (listed twice)"
    );
    assert_eq!(with(&|t| shape(t).child_end_bytes = DATA_START_BYTES), "raidz child_end_bytes");
    assert_eq!(with(&|t| t.log = true), "log (a RAID-Z vdev cannot be a log device)");
    assert_eq!(with(&|t| t.raidz = None), "raidz (missing on a RAID-Z vdev)");
    assert_eq!(with(&|t| t.kind = TopKind::Mirror), "raidz (on a vdev not RAID-Z)");
    // A label does not write one either.
    let label = LabelHeader {
        ashift: 12,
        pool_guid: 1,
        leaf_guid: 100,
        top_guid: 7,
        config_txg: 4,
        leaf_bytes: 1 << 31,
        pool_name: "tank".into(),
        config: raidz_tree(2, 3, &[]),
    };
    assert_eq!(invalid_field(label.encode()), "raidz child_count");
}

/// Features this build does not know are refused by name, before the tree is read (a newer
/// sluice's tree may not parse as this build's), in a bare config, a label and a directory.
#[test]
fn unknown_features_are_refused_by_name() {
    let raw = Raw { features: vec!["raidz", "foo", "bar"], ..Raw::good() };
    fn unknown<T: std::fmt::Debug>(result: Result<T, FormatError>) -> Vec<String> {
        match result {
            Err(FormatError::UnknownFeatures { what: "vdev tree config", names }) => names,
            other => panic!("expected UnknownFeatures, got {other:?}"),
        }
    }
    let error = VdevTreeConfig::decode(&raw.bytes(), FormatVersion::V6);
    assert_eq!(
        error.as_ref().map_err(ToString::to_string).expect_err("refused"),
        "vdev tree config needs feature(s) foo, bar, which this build of sluice does not know \
         (a newer sluice wrote it)"
    );
    assert_eq!(unknown(error), ["foo", "bar"]);
    // Whatever follows, even a tree this build could not parse.
    let mut garbage = b"\x01\x03foo".to_vec();
    garbage.extend_from_slice(&[0xff; 5]);
    assert_eq!(unknown(VdevTreeConfig::decode(&garbage, FormatVersion::V6)), ["foo"]);
    assert_eq!(unknown(VdevTreeConfig::decode(b"\x01\x03foo", FormatVersion::V6)), ["foo"]);
    // In a label.
    let label = label_with_config(&raw.bytes());
    assert_eq!(unknown(LabelHeader::decode(&label)), ["foo", "bar"]);
    // In a directory: its config's feature renamed in place.
    let mut dir = sluice_format::PoolDirectory {
        records: Some(sluice_format::DirectoryRecords {
            config: raidz_tree(1, 3, &[]),
            ..Default::default()
        }),
        ..Default::default()
    };
    dir.ddt.bucket_bits = 6;
    dir.ddt.levels = 1;
    let mut bytes = dir.encode(512).expect("a valid directory");
    assert_eq!(bytes[8..10], [6, 0]);
    assert_eq!(sluice_format::PoolDirectory::decode(&bytes).expect("decodes"), dir);
    let at = bytes.windows(6).position(|w| w == b"\x05raidz").expect("the feature is there");
    bytes[at + 1..at + 6].copy_from_slice(b"raidy");
    assert_eq!(unknown(sluice_format::PoolDirectory::decode(&bytes)), ["raidy"]);
}

/// A label is V1 or V6; a version between (labels never had one) or beyond is refused.
#[test]
fn label_versions() {
    assert_eq!(LABEL_VERSION, FormatVersion::V6);
    let mut label = label_with_config(&Raw::good().bytes());
    LabelHeader::decode(&label).expect("a V6 label decodes");
    for version in [0u16, 2, 3, 5, 7] {
        label[8..10].copy_from_slice(&version.to_le_bytes());
        rechecksum(&mut label);
        assert!(
            matches!(
                LabelHeader::decode(&label),
                Err(FormatError::UnsupportedVersion { what: "label", found }) if found == version
            ),
            "label version {version}"
        );
    }
    // A V6 config in a label that says V1 is not read as V1.
    label[8..10].copy_from_slice(&1u16.to_le_bytes());
    rechecksum(&mut label);
    assert!(LabelHeader::decode(&label).is_err());
}

/// One RAID-Z vdev of 64 children fits in a label with paths of realistic length, up to the
/// 51 bytes CONFIG_BYTES_MAX's doc works out (50 with a child being replaced).
#[test]
fn a_raidz_vdev_of_64_children_fits() {
    assert_eq!(CONFIG_BYTES_MAX, 3952);
    let tree = |path_len: usize, replacing: &[u16]| {
        let path = |i: u16| {
            let id = format!("-{i:02}");
            format!("/dev/disk/by-id/{}{id}", "x".repeat(path_len - 16 - id.len()))
        };
        let mut tree = raidz_tree(3, 64, replacing);
        for (i, leaf) in tree.top[0].children.iter_mut().enumerate() {
            leaf.path = path(i as u16);
        }
        for (column, leaf) in &mut tree.top[0].raidz.as_mut().expect("RAID-Z").replacing {
            leaf.path = path(100 + *column);
        }
        tree
    };
    let label = |config| LabelHeader {
        ashift: 12,
        pool_guid: 1,
        leaf_guid: 100,
        top_guid: 7,
        config_txg: 4,
        leaf_bytes: 1 << 31,
        pool_name: "tank".into(),
        config,
    };
    // A realistic name: /dev/disk/by-id/wwn-0x5000c500a1b2c3d4 is 38 bytes,
    // /dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1A2B3C 48.
    for path_len in [38, 48, 51] {
        let config = tree(path_len, &[]);
        let bytes = config.encode().expect("fits");
        assert_eq!(bytes.len(), 7 + 2 + 22 + 64 * (10 + path_len));
        let label = label(config);
        let encoded = label.encode().expect("fits in a label");
        assert_eq!(LabelHeader::decode(&encoded).expect("decodes"), label);
    }
    assert!(matches!(tree(52, &[]).encode(), Err(FormatError::TooLarge { .. })));
    let replacing = tree(50, &[9]);
    assert_eq!(replacing.encode().expect("fits").len(), 7 + 2 + 22 + 64 * 60 + 12 + 50);
    assert!(matches!(tree(51, &[9]).encode(), Err(FormatError::TooLarge { .. })));
}

/// Hot spares (feature `spares`): available ones and ones in use (a mirror child standing in
/// for another, a RAID-Z column's replacing leaf) round-trip, byte for byte as label.rs says;
/// a spare that is available yet a member, in use yet not a member, in another vdev than its
/// leaf, standing in for itself or for a leaf another spare has, listed twice, or the feature
/// listed with no spares, is refused both ways.
#[test]
fn hot_spares_are_a_feature_of_the_config() {
    let spare = |guid: u64, stands_in_for: u64| sluice_format::SpareConfig {
        guid,
        path: format!("/dev/s{guid}"),
        stands_in_for,
    };
    let mirror = TopConfig {
        kind: TopKind::Mirror,
        log: false,
        guid: 8,
        children: vec![child(900), child(901)],
        raidz: None,
    };
    let mut tree = raidz_tree(1, 4, &[]);
    tree.top.push(mirror.clone());
    tree.spares = vec![spare(500, 0), spare(501, 0)];
    assert_eq!((tree.features(), tree.version()), (vec!["raidz", "spares"], FormatVersion::V6));
    let bytes = tree.encode().expect("a valid tree");
    // The end of the config, as label.rs's byte table lays it out.
    let mut tail = vec![2u8];
    for guid in [500u64, 501] {
        let path = format!("/dev/s{guid}");
        tail.extend_from_slice(&guid.to_le_bytes());
        tail.extend_from_slice(&(path.len() as u16).to_le_bytes());
        tail.extend_from_slice(path.as_bytes());
        tail.extend_from_slice(&0u64.to_le_bytes());
    }
    assert!(bytes.ends_with(&tail));
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), tree);
    // In use: 500 is a child of the mirror standing in for 1000 (child 900), 501 replaces
    // column 2 of the RAID-Z vdev standing in for its child.
    let mut in_use = tree.clone();
    in_use.top[1].children.push(LeafConfig { guid: 500, path: "/dev/s500".into() });
    in_use.spares[0].stands_in_for = 1000;
    in_use.top[0].raidz.as_mut().unwrap().replacing =
        vec![(2, LeafConfig { guid: 501, path: "/dev/s501".into() })];
    in_use.spares[1].stands_in_for = 102;
    let bytes = in_use.encode().expect("a valid tree");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), in_use);
    // A pool with spares and nothing else that needs V6 is still written in V6.
    let plain = VdevTreeConfig { top: vec![mirror], spares: vec![spare(500, 0)], ..tree.clone() };
    assert_eq!(plain.features(), ["spares"]);
    let bytes = plain.encode().expect("a valid tree");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), plain);

    let refused = |bad: &VdevTreeConfig, why: &str| {
        assert!(bad.encode().is_err(), "encoded: {why}");
        // Written as a good tree would be, then the spares swapped in: decode refuses it too.
        let mut raw = bad.clone();
        let saved = std::mem::take(&mut raw.spares);
        let mut bytes = raw.encode().expect("the rest is valid");
        // The feature's name goes in the header; rebuild it with the feature listed.
        let features = bad.features();
        let mut out = vec![features.len() as u8];
        for name in &features {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
        let old_header = 1 + raw.features().iter().map(|n| 1 + n.len()).sum::<usize>();
        out.extend_from_slice(&bytes.split_off(old_header));
        out.push(saved.len() as u8);
        for s in &saved {
            out.extend_from_slice(&s.guid.to_le_bytes());
            out.extend_from_slice(&(s.path.len() as u16).to_le_bytes());
            out.extend_from_slice(s.path.as_bytes());
            out.extend_from_slice(&s.stands_in_for.to_le_bytes());
        }
        assert!(VdevTreeConfig::decode(&out, FormatVersion::V6).is_err(), "decoded: {why}");
    };
    let mut bad = in_use.clone();
    bad.spares[0].stands_in_for = 0;
    refused(&bad, "available yet a member");
    let mut bad = tree.clone();
    bad.spares[0].stands_in_for = 1000;
    refused(&bad, "in use yet not a member");
    let mut bad = in_use.clone();
    bad.spares[0].stands_in_for = 101;
    refused(&bad, "standing in for a leaf of another vdev");
    let mut bad = in_use.clone();
    bad.spares[0].stands_in_for = 500;
    refused(&bad, "standing in for itself");
    let mut bad = in_use.clone();
    bad.spares[1].stands_in_for = 1000;
    bad.spares[0].stands_in_for = 1000;
    refused(&bad, "two spares for one leaf");
    let mut bad = tree.clone();
    bad.spares[1].guid = 500;
    refused(&bad, "listed twice");
    // The feature with a count of zero.
    let mut bytes = plain.encode().unwrap();
    let count_at = bytes.len() - (8 + 2 + "/dev/s500".len() + 8) - 1;
    bytes.truncate(count_at + 1);
    bytes[count_at] = 0;
    assert!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).is_err());
}

#[test]
fn a_removed_log_devices_hole_is_a_feature_of_the_config() {
    let mirror = |guid: u64, log: bool| TopConfig {
        kind: TopKind::Mirror,
        log,
        guid,
        children: vec![child(guid as u16), child(guid as u16 + 1)],
        raidz: None,
    };
    let tree = VdevTreeConfig {
        top: vec![mirror(10, false), TopConfig::hole(), mirror(20, true)],
        ..VdevTreeConfig::default()
    };
    assert_eq!((tree.features(), tree.version()), (vec!["hole_vdevs"], FormatVersion::V6));
    let bytes = tree.encode().expect("a valid tree");
    // The hole, as label.rs's byte table lays it out: kind 3, guid 0, no children.
    let mut hole = vec![3u8];
    hole.extend_from_slice(&0u64.to_le_bytes());
    hole.extend_from_slice(&0u16.to_le_bytes());
    assert!(bytes.windows(hole.len()).any(|w| w == hole.as_slice()));
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), tree);
    // A hole serves everything it holds (nothing).
    assert!(tree.top[1].serves_with(|_| false));
    // Refused on both sides: a hole with a child, a guid, or the log bit.
    for bad in [
        TopConfig { children: vec![child(1)], ..TopConfig::hole() },
        TopConfig { guid: 5, ..TopConfig::hole() },
        TopConfig { log: true, ..TopConfig::hole() },
    ] {
        let mut wrong = tree.clone();
        wrong.top[1] = bad.clone();
        assert!(wrong.encode().is_err(), "encoded {bad:?}");
    }
    let at = bytes.windows(hole.len()).position(|w| w == hole.as_slice()).expect("the hole");
    let mut log_bit = bytes.clone();
    log_bit[at] |= 0x80;
    assert!(VdevTreeConfig::decode(&log_bit, FormatVersion::V6).is_err());
    let mut guid = bytes.clone();
    guid[at + 1] = 9;
    assert!(VdevTreeConfig::decode(&guid, FormatVersion::V6).is_err());
    // A reader that does not know the feature refuses the pool by its name.
    assert!(FEATURES_KNOWN.contains(&"hole_vdevs"));
    let mut unknown = bytes.clone();
    let name = unknown.windows(10).position(|w| w == b"hole_vdevs").expect("listed");
    unknown[name] = b'x';
    match VdevTreeConfig::decode(&unknown, FormatVersion::V6) {
        Err(FormatError::UnknownFeatures { names, .. }) => assert_eq!(names, ["xole_vdevs"]),
        other => panic!("{other:?}"),
    }
    // A V1 config has no holes: kind 3 there is refused.
    let v1 = VdevTreeConfig { top: vec![mirror(10, false)], ..VdevTreeConfig::default() };
    let mut v1_bytes = v1.encode().expect("a valid tree");
    v1_bytes[2] = 3;
    v1_bytes.truncate(3 + 8);
    v1_bytes.extend_from_slice(&0u16.to_le_bytes());
    assert!(VdevTreeConfig::decode(&v1_bytes, FormatVersion::V1).is_err());
}

/// A pool that stores its indirect blocks compressed names the feature `lz4_indirect`, in the
/// V6 layout, and reads back with it; a reader that does not know the name refuses the pool
/// by it. Its block pointers may say an indirect block is compressed; a pool metadata block's
/// may not.
#[test]
fn lz4_indirect_is_a_feature_and_only_data_and_indirect_blocks_are_compressed() {
    let mirror = TopConfig {
        kind: TopKind::Mirror,
        log: false,
        guid: 10,
        children: vec![child(10), child(11)],
        raidz: None,
    };
    let tree =
        VdevTreeConfig { top: vec![mirror], lz4_indirect: true, ..VdevTreeConfig::default() };
    assert_eq!((tree.features(), tree.version()), (vec!["lz4_indirect"], FormatVersion::V6));
    let bytes = tree.encode().expect("a valid tree");
    assert_eq!(VdevTreeConfig::decode(&bytes, FormatVersion::V6).expect("decodes"), tree);
    let mut unknown = bytes.clone();
    let name = unknown.windows(12).position(|w| w == b"lz4_indirect").expect("listed");
    unknown[name] = b'x';
    match VdevTreeConfig::decode(&unknown, FormatVersion::V6) {
        Err(FormatError::UnknownFeatures { names, .. }) => assert_eq!(names, ["xz4_indirect"]),
        other => panic!("{other:?}"),
    }

    use sluice_format::{BlockCompression, BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva};
    let bp = |kind: BlockKind, level: u8| BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 8, offset_sectors: 64 },
            Dva::default(),
            Dva::default(),
        ],
        lsize_sectors: 32,
        psize_sectors: 8,
        birth_txg: 5,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::Lz4,
        kind,
        level,
        fill: 1,
        checksum: Checksum([7; 16]),
        dedup: None,
        crypt: Default::default(),
    };
    for (kind, level, decodes) in [
        (BlockKind::Data, 0, true),
        (BlockKind::Indirect, 1, true),
        (BlockKind::Metadata, 0, false),
    ] {
        let encoded = BlockPointer::encode(Some(&bp(kind, level)));
        let decoded = BlockPointer::decode(&encoded);
        assert_eq!(decoded.is_ok(), decodes, "{kind:?}: {decoded:?}");
        if decodes {
            assert_eq!(decoded.unwrap(), Some(bp(kind, level)));
        }
    }
}
