//! Encryption's on-disk fields: an encrypted block's pointer (salt, IV and MAC where the third
//! DVA and the dedup key were), an indirect block's hash of its children's MACs, and an
//! encryption root's wrapped key. Golden bytes pin each layout (regenerate with
//! `SLUICE_BLESS=1 cargo test -p sluice-format --test format crypt::` after an intended
//! change); pointers without encryption encode as before (tests/format.rs's golden pins that).

use crate::common::golden;

use proptest::prelude::*;
use sluice_format::{
    Argon2Params, BlockCompression, BlockCrypt, BlockKind, BlockPointer, Checksum, ChecksumAlg,
    CryptSuite, Dva, FormatError, KeyFormat, KeyLocation, WrappedKey, BLKPTR_BYTES,
    KEY_LOCATION_BYTES_MAX, WRAPPED_KEY_FIXED_BYTES,
};

fn encrypted_bp(dedup: bool) -> BlockPointer {
    let checksum = ChecksumAlg::Xxh3_128.compute(&[0x5a; 4096]);
    let mac = [0xc3; 16];
    BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 8, offset_sectors: 8192 },
            Dva { vdev: 1, asize_sectors: 8, offset_sectors: 4096 },
            Dva::default(),
        ],
        lsize_sectors: 32,
        psize_sectors: 8,
        birth_txg: 42,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::Lz4,
        kind: BlockKind::Data,
        level: 0,
        fill: 1,
        checksum,
        dedup: dedup.then(|| BlockPointer::encrypted_dedup_key(&checksum, &mac)),
        crypt: BlockCrypt::Encrypted {
            family: 0xfa17_0000_0000_0001,
            salt: 0x0123_4567_89ab_cdef,
            iv: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            mac,
        },
    }
}

fn indirect_bp() -> BlockPointer {
    BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 32, offset_sectors: 100 },
            Dva { vdev: 1, asize_sectors: 32, offset_sectors: 200 },
            Dva { vdev: 2, asize_sectors: 32, offset_sectors: 300 },
        ],
        lsize_sectors: 32,
        psize_sectors: 32,
        birth_txg: 43,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::None,
        kind: BlockKind::Indirect,
        level: 1,
        fill: 77,
        checksum: Checksum([9; 16]),
        dedup: None,
        crypt: BlockCrypt::ChildrenMac([0xa7; 32]),
    }
}

#[test]
fn golden_encrypted_block_pointers() {
    let mut bytes = Vec::new();
    for bp in [encrypted_bp(false), encrypted_bp(true), indirect_bp()] {
        let encoded = BlockPointer::encode(Some(&bp));
        assert_eq!(BlockPointer::decode(&encoded).unwrap(), Some(bp));
        bytes.extend_from_slice(&encoded);
    }
    golden("blkptr_crypt.bin", &bytes);
}

#[test]
fn an_encrypted_pointer_keeps_its_fields_where_the_table_says() {
    let bp = encrypted_bp(true);
    let bytes = BlockPointer::encode(Some(&bp));
    assert_eq!(bytes[68], 3, "flags: dedup and encrypted");
    assert_eq!(&bytes[32..40], &0x0123_4567_89ab_cdef_u64.to_le_bytes(), "salt");
    assert_eq!(&bytes[40..48], &0xfa17_0000_0000_0001_u64.to_le_bytes(), "key family");
    assert_eq!(&bytes[96..108], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "iv");
    assert_eq!(&bytes[108..124], &[0xc3; 16], "mac");
    assert!(bytes[124..].iter().all(|&b| b == 0), "reserved after the mac");
    assert_eq!(&bytes[80..96], &bp.checksum.0, "the checksum stays where it was");
    // The dedup key of an encrypted block is its checksum and its MAC: what a keyless free
    // needs to find the table entry.
    let key = bp.dedup.unwrap();
    assert_eq!(&key.0[..16], &bp.checksum.0);
    assert_eq!(&key.0[16..], &[0xc3; 16]);
}

/// What a parent's rebuild reads from a slot without decoding it: the fill, and whether the
/// slot belongs to an encrypted tree (then the parent hashes its children and decodes them).
#[test]
fn a_slots_fill_and_encryption_read_without_decoding() {
    let hole = BlockPointer::encode(None);
    assert_eq!(BlockPointer::encoded_fill(&hole), 0);
    assert!(!BlockPointer::encoded_is_authenticated(&hole));
    let encrypted = BlockPointer { fill: 7, ..encrypted_bp(true) };
    let bytes = BlockPointer::encode(Some(&encrypted));
    assert_eq!(BlockPointer::encoded_fill(&bytes), 7);
    assert!(BlockPointer::encoded_is_authenticated(&bytes));
    let plain = BlockPointer {
        dvas: [encrypted.dvas[0], encrypted.dvas[1], Dva::default()],
        crypt: BlockCrypt::None,
        dedup: None,
        fill: 1 << 40,
        ..encrypted
    };
    let bytes = BlockPointer::encode(Some(&plain));
    assert_eq!(BlockPointer::encoded_fill(&bytes), 1 << 40);
    assert!(!BlockPointer::encoded_is_authenticated(&bytes));
    let above = BlockPointer {
        kind: BlockKind::Indirect,
        level: 1,
        compression: BlockCompression::None,
        psize_sectors: 32,
        crypt: BlockCrypt::ChildrenMac([9; 32]),
        ..plain
    };
    assert!(BlockPointer::encoded_is_authenticated(&BlockPointer::encode(Some(&above))));
}

#[test]
fn malformed_encryption_fields_are_refused() {
    let refused = |bytes: &[u8; BLKPTR_BYTES], why: &str| {
        assert!(BlockPointer::decode(bytes).is_err(), "{why} decoded");
    };
    let good = BlockPointer::encode(Some(&encrypted_bp(false)));
    for at in 124..128 {
        let mut bytes = good;
        bytes[at] = 1;
        refused(&bytes, &format!("a reserved byte at {at}"));
    }
    // Encrypted is for data blocks, children's MACs for indirect blocks.
    let mut bytes = good;
    bytes[66] = BlockKind::Indirect as u8;
    refused(&bytes, "an encrypted indirect block");
    let mut bytes = BlockPointer::encode(Some(&indirect_bp()));
    bytes[66] = BlockKind::Data as u8;
    bytes[67] = 0;
    refused(&bytes, "a data block with children's MACs");
    // An encrypted block above level 0, or of family 0; children's MACs at level 0.
    let mut bytes = good;
    bytes[67] = 1;
    refused(&bytes, "an encrypted block at level 1");
    let mut bytes = good;
    bytes[40..48].fill(0);
    refused(&bytes, "an encrypted block of family 0");
    let mut bytes = BlockPointer::encode(Some(&indirect_bp()));
    bytes[67] = 0;
    refused(&bytes, "children's MACs at level 0");
    // Flags this build does not know, or that do not go together.
    for flags in [5u8, 6, 7, 8, 0x80] {
        let mut bytes = good;
        bytes[68] = flags;
        refused(&bytes, &format!("flags {flags:#x}"));
    }
}

#[test]
fn auth_bytes_cover_the_portable_fields_only() {
    let bp = encrypted_bp(false);
    let base = BlockPointer::auth_bytes(Some(&bp));
    assert_eq!(BlockPointer::auth_bytes(None), [0; 64], "a hole");
    // Where the block lives, when it was written, its checksum and its dedup flag are not
    // covered: a raw receive stores the same block elsewhere, later, either way.
    let moved = BlockPointer {
        dvas: [
            Dva { vdev: 3, asize_sectors: 8, offset_sectors: 1 },
            Dva::default(),
            Dva::default(),
        ],
        birth_txg: 900,
        checksum: Checksum([0; 16]),
        ..bp
    };
    assert_eq!(BlockPointer::auth_bytes(Some(&moved)), base);
    assert_eq!(BlockPointer::auth_bytes(Some(&encrypted_bp(true))), base);
    // Everything that says what the block is, is.
    let BlockCrypt::Encrypted { family, salt, iv, mac } = bp.crypt else { unreachable!() };
    let changed = [
        BlockPointer { lsize_sectors: 31, ..bp },
        BlockPointer { psize_sectors: 9, ..bp },
        BlockPointer { compression: BlockCompression::Zstd, ..bp },
        BlockPointer { fill: 2, ..bp },
        BlockPointer { crypt: BlockCrypt::Encrypted { family, salt: salt ^ 1, iv, mac }, ..bp },
        BlockPointer { crypt: BlockCrypt::Encrypted { family, salt, iv: [0; 12], mac }, ..bp },
        BlockPointer { crypt: BlockCrypt::Encrypted { family, salt, iv, mac: [0; 16] }, ..bp },
        BlockPointer { crypt: BlockCrypt::Encrypted { family: 2, salt, iv, mac }, ..bp },
        BlockPointer { crypt: BlockCrypt::None, ..bp },
    ];
    for (i, other) in changed.iter().enumerate() {
        assert_ne!(BlockPointer::auth_bytes(Some(other)), base, "change {i} not covered");
    }
    let ind = indirect_bp();
    assert_ne!(
        BlockPointer::auth_bytes(Some(&ind)),
        BlockPointer::auth_bytes(Some(&BlockPointer {
            crypt: BlockCrypt::ChildrenMac([0; 32]),
            ..ind
        }))
    );
}

fn passphrase_key() -> WrappedKey {
    WrappedKey {
        guid: 0x1111_2222_3333_4444,
        suite: CryptSuite::Aes256Gcm,
        format: KeyFormat::Passphrase,
        kdf: Some(Argon2Params { memory_kib: 65536, passes: 3, lanes: 1, salt: [0x5c; 16] }),
        location: KeyLocation::File("/etc/sluice/keys/tank-db.key".into()),
        iv: [0x21; 12],
        mac: [0x42; 16],
        wrapped: [0x84; 32],
    }
}

fn raw_key() -> WrappedKey {
    WrappedKey {
        format: KeyFormat::Raw,
        kdf: None,
        location: KeyLocation::Prompt,
        ..passphrase_key()
    }
}

#[test]
fn golden_wrapped_keys() {
    let mut bytes = Vec::new();
    for key in [passphrase_key(), raw_key()] {
        let encoded = key.encode().unwrap();
        assert_eq!(encoded.len(), key.encoded_len());
        let (decoded, used) = WrappedKey::decode(&encoded).unwrap();
        assert_eq!((decoded, used), (key, encoded.len()));
        bytes.extend_from_slice(&encoded);
    }
    golden("wrapped_key.bin", &bytes);
    // Two records back to back decode one after the other.
    let (first, used) = WrappedKey::decode(&bytes).unwrap();
    assert_eq!(first, passphrase_key());
    assert_eq!(WrappedKey::decode(&bytes[used..]).unwrap().0, raw_key());
}

#[test]
fn the_wrap_aad_binds_what_derives_the_key() {
    let key = passphrase_key();
    let aad = key.wrap_aad();
    let weaker = |k: WrappedKey| assert_ne!(k.wrap_aad(), aad);
    weaker(WrappedKey { guid: 1, ..key.clone() });
    weaker(WrappedKey { format: KeyFormat::Raw, kdf: None, ..key.clone() });
    let kdf = key.kdf.unwrap();
    weaker(WrappedKey { kdf: Some(Argon2Params { memory_kib: 8, ..kdf }), ..key.clone() });
    weaker(WrappedKey { kdf: Some(Argon2Params { passes: 1, ..kdf }), ..key.clone() });
    weaker(WrappedKey { kdf: Some(Argon2Params { lanes: 4, ..kdf }), ..key.clone() });
    // The location only says where to look: it may change without the key.
    assert_eq!(WrappedKey { location: KeyLocation::Prompt, ..key.clone() }.wrap_aad(), aad);
}

#[test]
fn malformed_wrapped_keys_are_refused() {
    let good = passphrase_key().encode().unwrap();
    let refused = |bytes: &[u8], why: &str| {
        assert!(WrappedKey::decode(bytes).is_err(), "{why} decoded");
    };
    refused(&good[..WRAPPED_KEY_FIXED_BYTES - 1], "a truncated record");
    refused(&good[..good.len() - 1], "a truncated key location");
    for (at, value, why) in [
        (8, 2u8, "an unknown suite"),
        (9, 4, "an unknown key format"),
        (9, 1, "a raw key with a KDF"),
        (10, 2, "an unknown KDF"),
        (11, 2, "an unknown key location kind"),
        (11, 0, "a prompt with a path"),
        (14, 1, "a reserved byte"),
        (28, 1, "a reserved byte"),
        (108, 1, "a reserved byte"),
    ] {
        let mut bytes = good.clone();
        bytes[at] = value;
        refused(&bytes, why);
    }
    let mut bytes = raw_key().encode().unwrap();
    bytes[16] = 1;
    refused(&bytes, "KDF parameters on a raw key");
    // Parameters that would make a key load take the machine are refused before any work.
    for (at, value, why) in [
        (16, (1u32 << 20) + 1, "argon2 memory over 1 GiB"),
        (16, 0, "argon2 memory 0"),
        (20, 65, "argon2 passes over 64"),
        (24, 17, "argon2 lanes over 16"),
    ] {
        let mut bytes = good.clone();
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        refused(&bytes, why);
    }
    let long = WrappedKey {
        location: KeyLocation::File("/".repeat(KEY_LOCATION_BYTES_MAX + 1)),
        ..raw_key()
    };
    assert!(matches!(long.encode(), Err(FormatError::TooLarge { .. })));
    let no_kdf = WrappedKey { kdf: None, ..passphrase_key() };
    assert!(no_kdf.encode().is_err(), "a passphrase key without its KDF parameters");
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1300)) {
        let _ = WrappedKey::decode(&bytes);
        let _ = BlockPointer::decode(&bytes);
    }

    #[test]
    fn wrapped_keys_round_trip(
        guid in any::<u64>(),
        passphrase in any::<bool>(),
        path in proptest::option::of("/[a-z0-9/._-]{1,200}"),
        iv in any::<[u8; 12]>(),
        mac in any::<[u8; 16]>(),
        wrapped in any::<[u8; 32]>(),
        salt in any::<[u8; 16]>(),
    ) {
        let key = WrappedKey {
            guid,
            suite: CryptSuite::Aes256Gcm,
            format: if passphrase { KeyFormat::Passphrase } else { KeyFormat::Hex },
            kdf: passphrase.then_some(Argon2Params { memory_kib: 1024, passes: 2, lanes: 1, salt }),
            location: path.map_or(KeyLocation::Prompt, KeyLocation::File),
            iv,
            mac,
            wrapped,
        };
        let bytes = key.encode().unwrap();
        prop_assert_eq!(WrappedKey::decode(&bytes).unwrap(), (key, bytes.len()));
    }
}
