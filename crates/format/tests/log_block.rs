//! Intent-log block format: golden bytes, round trips, and the properties replay relies on: a
//! block of another chain or position, a torn block and a flipped bit are all refused, so the
//! end of a log is found and never misread; decoding arbitrary bytes never panics.

use std::path::PathBuf;

use proptest::prelude::*;
use sluice_format::{
    BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva, FormatError, LogBlock, LogRecord,
    LogVerifier, RecordSeal, LOG_WRITE_UNIT_BYTES, RECORD_SEAL_BYTES,
};

const VERIFIER: LogVerifier = LogVerifier { chain_id: 0xc0ffee, volume_id: 7, sequence: 3 };

/// The block pointer the sample's indirect record and successor use.
fn sample_pointer() -> BlockPointer {
    BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 32, offset_sectors: 4096 },
            Dva::default(),
            Dva::default(),
        ],
        lsize_sectors: 32,
        psize_sectors: 32,
        birth_txg: 9,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: sluice_format::BlockCompression::None,
        kind: BlockKind::Data,
        level: 0,
        fill: 1,
        checksum: Checksum([5; 16]),
        dedup: None,
        crypt: sluice_format::BlockCrypt::None,
    }
}

fn sample() -> LogBlock {
    let block = sample_pointer();
    LogBlock {
        verifier: VERIFIER,
        next: Some(block),
        records: vec![
            LogRecord::Write { txg: 9, sequence: 100, offset: 4096, data: vec![0xab; 13] },
            LogRecord::WriteIndirect { txg: 9, sequence: 101, offset: 1 << 20, len: 16384, block },
            LogRecord::Zero { txg: 10, sequence: 102, offset: 0, len: 8192 },
        ],
        seals: Vec::new(),
    }
}

#[test]
fn golden_log_block() {
    let bytes = sample().encode_into(128 << 10, checked_gather).unwrap();
    assert_eq!(bytes.len(), LOG_WRITE_UNIT_BYTES, "written short: one 4 KiB unit");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/log_block.bin");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    assert!(std::fs::read(&path).unwrap() == bytes, "log block layout changed");
    assert_eq!(LogBlock::decode(&bytes, VERIFIER).unwrap(), sample());
}

/// An intact block that is not the one expected (older chain, other volume, other position)
/// ends the log instead of being replayed.
#[test]
fn stale_blocks_are_refused() {
    let bytes = sample().encode(128 << 10).unwrap();
    for other in [
        LogVerifier { chain_id: 1, ..VERIFIER },
        LogVerifier { volume_id: 8, ..VERIFIER },
        VERIFIER.next(),
    ] {
        assert!(matches!(
            LogBlock::decode(&bytes, other),
            Err(FormatError::Invalid { field: "verifier", .. })
        ));
    }
    // Torn: the second 4 KiB unit of a two-unit block never arrived.
    let mut big = sample();
    big.records.push(LogRecord::Write { txg: 10, sequence: 103, offset: 0, data: vec![7; 6000] });
    let mut bytes = big.encode(128 << 10).unwrap();
    assert_eq!(bytes.len(), 2 * LOG_WRITE_UNIT_BYTES);
    bytes[LOG_WRITE_UNIT_BYTES..].fill(0);
    assert!(LogBlock::decode(&bytes, VERIFIER).is_err());
    assert!(LogBlock::decode(&bytes[..LOG_WRITE_UNIT_BYTES], VERIFIER).is_err());
    // Too much for the block size.
    assert!(matches!(big.encode(4096), Err(FormatError::TooLarge { .. })));
}

/// A stand-in cipher for the layout tests (the real one is the engine's AES-256-GCM): xors
/// the payload and derives a seal from the additional data, so a test can tell that each
/// record was sealed with its own `seal_aad` and that the payload was replaced in place.
fn toy_seal(aad: &[u8], payload: &mut [u8]) -> Result<RecordSeal, ()> {
    payload.iter_mut().for_each(|b| *b ^= 0x5a);
    let sum = twox_hash::XxHash3_128::oneshot(aad).to_le_bytes();
    let mut iv = [0u8; 12];
    iv.copy_from_slice(&sum[..12]);
    Ok(RecordSeal { salt: aad.len() as u64, iv, mac: sum })
}

/// A sealed block (an encrypted volume's chain): golden bytes at V7, each record's seal made
/// over its own additional data, the payload replaced where it lies, and everything the claim
/// reads left as it was.
#[test]
fn golden_sealed_log_block() {
    let block = sample();
    let bytes = block.encode_sealed_into(128 << 10, checked_gather, toy_seal).unwrap().unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/log_block_sealed.bin");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    assert!(std::fs::read(&path).unwrap() == bytes, "sealed log block layout changed");
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 7, "a sealed block is written at V7");
    let read = LogBlock::decode(&bytes, VERIFIER).unwrap();
    assert!(read.sealed());
    assert_eq!(read.seals.len(), block.records.len());
    for (index, ((record, read_record), seal)) in
        block.records.iter().zip(&read.records).zip(&read.seals).enumerate()
    {
        let aad = read.record_aad(index);
        assert!(aad.starts_with(&record.seal_aad(VERIFIER)));
        let mut expected_payload = match record {
            LogRecord::Write { data, .. } => data.clone(),
            _ => Vec::new(),
        };
        assert_eq!(*seal, toy_seal(&aad, &mut expected_payload).unwrap());
        match (record, read_record) {
            (LogRecord::Write { data, .. }, LogRecord::Write { data: stored, .. }) => {
                let clear: Vec<u8> = stored.iter().map(|b| b ^ 0x5a).collect();
                assert_eq!(&clear, data, "the payload is what the sealer left in place");
                assert_ne!(stored, data);
            }
            (other, read) => assert_eq!(other, read, "what the claim reads is left readable"),
        }
    }
    // The first record is linked to the header, the others to the tag before them.
    assert!(read.record_aad(0).ends_with(&bytes[..176]));
    assert!(read.record_aad(2).ends_with(&read.seals[1].mac));
    assert_eq!(bytes.len(), LOG_WRITE_UNIT_BYTES, "the seals fit the same 4 KiB unit");
    assert_eq!(read.used_bytes_in(true), block.used_bytes() + 3 * RECORD_SEAL_BYTES);
}

/// The additional data binds every field the claim reads and the block's place: changing any
/// of them changes it.
#[test]
fn seal_aad_binds_the_records_place_and_fields() {
    let record = LogRecord::Write { txg: 9, sequence: 100, offset: 4096, data: vec![1; 8] };
    let base = record.seal_aad(VERIFIER);
    let others = [
        LogRecord::Write { txg: 10, sequence: 100, offset: 4096, data: vec![1; 8] },
        LogRecord::Write { txg: 9, sequence: 101, offset: 4096, data: vec![1; 8] },
        LogRecord::Write { txg: 9, sequence: 100, offset: 8192, data: vec![1; 8] },
        LogRecord::Write { txg: 9, sequence: 100, offset: 4096, data: vec![1; 9] },
        LogRecord::Zero { txg: 9, sequence: 100, offset: 4096, len: 8 },
    ];
    for other in &others {
        assert_ne!(other.seal_aad(VERIFIER), base, "{other:?}");
    }
    for place in [
        LogVerifier { chain_id: 1, ..VERIFIER },
        LogVerifier { volume_id: 8, ..VERIFIER },
        VERIFIER.next(),
    ] {
        assert_ne!(record.seal_aad(place), base);
    }
    // The payload is not additional data: the same fields with other bytes give the same.
    let same = LogRecord::Write { txg: 9, sequence: 100, offset: 4096, data: vec![2; 8] };
    assert_eq!(same.seal_aad(VERIFIER), base);
}

/// The sealed flag is only valid at V7: an unsealed version with it set is refused, so a
/// V1 reader's reserved byte is never taken for it.
#[test]
fn a_sealed_flag_below_v7_is_refused() {
    let mut bytes = sample().encode(128 << 10).unwrap();
    bytes[11] = 1;
    bytes[176..192].fill(0);
    let sum = ChecksumAlg::Xxh3_128.compute(&bytes);
    bytes[176..192].copy_from_slice(&sum.0);
    assert!(matches!(
        LogBlock::decode(&bytes, VERIFIER),
        Err(FormatError::Invalid { field: "flags", .. })
    ));
}

/// [`sluice_format::gather_vec`], after checking the pieces ascend, do not overlap and lie
/// within the block.
fn checked_gather(len: usize, pieces: &[(usize, &[u8])]) -> Vec<u8> {
    let mut end = 0;
    for (at, bytes) in pieces {
        assert!(*at >= end, "piece at {at} overlaps the one ending at {end}");
        end = at + bytes.len();
        assert!(end <= len, "piece at {at} of {} bytes ends past {len}", bytes.len());
    }
    sluice_format::gather_vec(len, pieces)
}

fn arb_record() -> impl Strategy<Value = LogRecord> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..600))
            .prop_map(|(txg, sequence, offset, data)| LogRecord::Write {
                txg,
                sequence,
                offset,
                data
            }),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(txg, sequence, offset, len)| LogRecord::Zero { txg, sequence, offset, len }
        ),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(txg, sequence, offset, len)| LogRecord::WriteIndirect {
                txg,
                sequence,
                offset,
                len,
                block: sample_pointer()
            }
        ),
    ]
}

proptest! {
    #[test]
    fn round_trips(records in proptest::collection::vec(arb_record(), 0..40), chain_id: u64, sequence in 1u64..1000) {
        let verifier = LogVerifier { chain_id, volume_id: 1, sequence };
        let block = LogBlock { verifier, next: None, records, seals: Vec::new() };
        let bytes = block.encode(128 << 10).unwrap();
        prop_assert_eq!(bytes.len() % LOG_WRITE_UNIT_BYTES, 0);
        // The pieces keep the gather's contract (`AlignedBuf::gathered` panics otherwise).
        let checked = block.encode_into(128 << 10, checked_gather).unwrap();
        prop_assert_eq!(&checked, &bytes);
        prop_assert_eq!(LogBlock::decode(&bytes, verifier).unwrap(), block);
    }

    #[test]
    fn sealed_round_trips(records in proptest::collection::vec(arb_record(), 0..40), sequence in 1u64..1000) {
        let verifier = LogVerifier { chain_id: 5, volume_id: 1, sequence };
        let block = LogBlock { verifier, next: None, records, seals: Vec::new() };
        let bytes = block.encode_sealed_into(128 << 10, checked_gather, toy_seal).unwrap().unwrap();
        let read = LogBlock::decode(&bytes, verifier).unwrap();
        prop_assert_eq!(read.seals.len(), block.records.len());
        prop_assert_eq!(read.used_bytes_in(true), block.used_bytes_in(true));
    }

    /// Any single flipped bit in the written bytes is detected.
    #[test]
    fn bit_flips_are_detected(bit in 0usize..(LOG_WRITE_UNIT_BYTES * 8)) {
        let mut bytes = sample().encode(128 << 10).unwrap();
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(LogBlock::decode(&bytes, VERIFIER).is_err());
    }

    #[test]
    fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
        let _ = LogBlock::decode(&bytes, VERIFIER);
    }
}
