//! Intent-log block format: golden bytes, round trips, and the properties replay relies on: a
//! block of another chain or position, a torn block and a flipped bit are all refused, so the
//! end of a log is found and never misread; decoding arbitrary bytes never panics.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use proptest::prelude::*;
use sluice_format::{
    BlockKind, BlockPointer, Checksum, ChecksumAlg, Dva, FormatError, LogBlock, LogRecord,
    LogVerifier, LOG_WRITE_UNIT_BYTES,
};

const VERIFIER: LogVerifier = LogVerifier { chain_id: 0xc0ffee, volume_id: 7, sequence: 3 };

fn sample() -> LogBlock {
    let block = BlockPointer {
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
    };
    LogBlock {
        verifier: VERIFIER,
        next: Some(block),
        records: vec![
            LogRecord::Write { txg: 9, sequence: 100, offset: 4096, data: vec![0xab; 13] },
            LogRecord::WriteIndirect { txg: 9, sequence: 101, offset: 1 << 20, len: 16384, block },
            LogRecord::Zero { txg: 10, sequence: 102, offset: 0, len: 8192 },
        ],
    }
}

#[test]
fn golden_log_block() {
    let bytes = sample().encode(128 << 10).unwrap();
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
    ]
}

proptest! {
    #[test]
    fn round_trips(records in proptest::collection::vec(arb_record(), 0..40), chain_id: u64, sequence in 1u64..1000) {
        let verifier = LogVerifier { chain_id, volume_id: 1, sequence };
        let block = LogBlock { verifier, next: None, records };
        let bytes = block.encode(128 << 10).unwrap();
        prop_assert_eq!(bytes.len() % LOG_WRITE_UNIT_BYTES, 0);
        prop_assert_eq!(LogBlock::decode(&bytes, verifier).unwrap(), block);
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
