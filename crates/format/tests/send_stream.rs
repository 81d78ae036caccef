//! Send streams: records round-trip; a stream that is damaged, cut short, reordered or newer
//! than this build is refused at the record where it goes wrong, naming it.

use std::path::PathBuf;

use sluice_format::{
    Argon2Params, BlockCompression, CryptSuite, KeyFormat, KeyLocation, RawBegin, ResumeToken,
    StreamBegin, StreamError, StreamReader, StreamRecord, StreamWriter, TokenError, WrappedKey,
};

fn records() -> Vec<StreamRecord> {
    vec![
        StreamRecord::Begin(StreamBegin {
            block_bytes: 16384,
            size_bytes: 1 << 30,
            guid: 0x1234,
            txg: 77,
            creation_secs: 1_795_000_000,
            from_guid: Some(0x99),
            name: "nightly".into(),
            source: "tank/db".into(),
            resume_block: Some(12),
            raw: None,
        }),
        StreamRecord::Data {
            block: 3,
            lsize: 16384,
            compression: BlockCompression::None,
            bytes: vec![7u8; 16384],
        },
        StreamRecord::Free { first: 4, count: 60 },
        StreamRecord::Data {
            block: 70,
            lsize: 16384,
            compression: BlockCompression::Lz4,
            bytes: vec![1, 2, 3, 4, 5],
        },
    ]
}

fn stream() -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    for record in records() {
        writer.write(&record).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), (4, 16389));
    out
}

fn read_all(bytes: &[u8]) -> Result<Vec<StreamRecord>, StreamError> {
    let mut reader = StreamReader::new(bytes);
    let mut out = Vec::new();
    while let Some(record) = reader.next_record()? {
        out.push(record);
    }
    Ok(out)
}

#[test]
fn records_round_trip() {
    let got = read_all(&stream()).unwrap();
    assert_eq!(got[..4], records()[..]);
    assert_eq!(got[4], StreamRecord::End { records: 4, data_bytes: 16389 });
}

#[test]
fn damage_is_refused_at_its_record() {
    let bytes = stream();
    // A flipped byte inside the second data record's payload (record 3).
    let mut damaged = bytes.clone();
    let at = bytes.len() - 24 - 16 - 16 - 16 - 3;
    damaged[at] ^= 1;
    let error = read_all(&damaged).unwrap_err();
    assert!(matches!(error, StreamError::Record { record: 3, .. }), "{error}");
    assert!(error.to_string().contains("record 3") && error.to_string().contains("checksum"));
    // Cut short anywhere: inside a record, or between records before the end.
    for len in [10, 24 + 30, bytes.len() - 40, bytes.len() - 56] {
        let error = read_all(&bytes[..len]).unwrap_err();
        assert!(matches!(error, StreamError::Truncated { .. }), "{len}: {error}");
    }
    // Records swapped: the free record (2) where the first data record (1) was due.
    let mut out = Vec::new();
    let all = records();
    for (sequence, record) in [(0, &all[0]), (2, &all[2])] {
        out.extend(record.encode(sequence).unwrap());
    }
    let error = read_all(&out).unwrap_err();
    assert!(matches!(error, StreamError::OutOfOrder { expected: 1, found: 2 }), "{error}");
    // A stream that does not begin with its begin record.
    let error = read_all(&all[2].encode(0).unwrap()).unwrap_err();
    assert!(matches!(error, StreamError::Unexpected { record: 0, .. }), "{error}");
}

#[test]
fn a_newer_version_is_refused_clearly() {
    let mut begin = records()[0].encode(0).unwrap();
    // The version field of the begin payload (offset 8 of the payload, after the 24-byte
    // header), and the record's checksum made good again.
    begin[24 + 8] = 9;
    let len = begin.len();
    let sum = sluice_format::ChecksumAlg::Xxh3_128.compute(&begin[..len - 16]);
    begin[len - 16..].copy_from_slice(&sum.0);
    let error = read_all(&begin).unwrap_err();
    assert!(matches!(error, StreamError::NewerVersion { found: 9, newest: 2 }), "{error}");
    assert!(error.to_string().contains("newer sluice"), "{error}");
}

/// A resume token round-trips; one cut, altered or not hex is refused with the reason.
#[test]
fn resume_tokens() {
    let token = ResumeToken {
        to_guid: 0xdead_beef,
        from_guid: Some(5),
        next_block: 40_000,
        source: "tank/db".into(),
    };
    let text = token.encode();
    assert!(text.starts_with("1-"));
    assert_eq!(ResumeToken::decode(&text).unwrap(), token);
    let full = ResumeToken { from_guid: None, ..token.clone() };
    assert_eq!(ResumeToken::decode(&full.encode()).unwrap(), full);
    // One hex digit changed: the checksum catches it.
    let mut altered = text.clone().into_bytes();
    let at = 10;
    altered[at] = if altered[at] == b'0' { b'1' } else { b'0' };
    let altered = String::from_utf8(altered).unwrap();
    assert!(matches!(ResumeToken::decode(&altered), Err(TokenError::Damaged)));
    assert!(matches!(ResumeToken::decode(&text[..text.len() - 2]), Err(TokenError::Damaged)));
    assert!(matches!(ResumeToken::decode("1-xyz0"), Err(TokenError::Malformed)));
    assert!(matches!(ResumeToken::decode("2-00"), Err(TokenError::Malformed)));
    assert!(matches!(ResumeToken::decode("1-00"), Err(TokenError::Malformed)));
}

fn raw_records() -> Vec<StreamRecord> {
    let key = WrappedKey {
        guid: 0x5eed,
        suite: CryptSuite::Aes256Gcm,
        format: KeyFormat::Passphrase,
        kdf: Some(Argon2Params { memory_kib: 65536, passes: 3, lanes: 1, salt: [4; 16] }),
        location: KeyLocation::File("/etc/sluice/db.key".into()),
        iv: [1; 12],
        mac: [2; 16],
        wrapped: [3; 32],
    };
    vec![
        StreamRecord::Begin(StreamBegin {
            block_bytes: 16384,
            size_bytes: 1 << 30,
            guid: 0x1234,
            txg: 77,
            creation_secs: 1_795_000_000,
            from_guid: None,
            name: "nightly".into(),
            source: "tank/db".into(),
            resume_block: None,
            raw: Some(Box::new(RawBegin { key, root_mac: [9; 32] })),
        }),
        StreamRecord::RawData {
            block: 3,
            lsize: 16384,
            compression: BlockCompression::Lz4,
            salt: 0xabcdef,
            iv: [5; 12],
            mac: [6; 16],
            bytes: vec![0x77; 4096],
        },
        StreamRecord::Free { first: 4, count: 60 },
    ]
}

/// A raw stream: golden bytes (version 2, the raw flag, the root MAC and the wrapped key in
/// the begin record, a raw data record with its seal), and a round trip.
#[test]
fn raw_streams_round_trip_and_keep_their_layout() {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    for record in raw_records() {
        writer.write(&record).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), (3, 4096));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/raw_stream.bin");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, &out).unwrap();
    }
    assert!(std::fs::read(&path).unwrap() == out, "raw stream layout changed");
    // The begin payload's version is 2 and its flags say raw.
    assert_eq!(u16::from_le_bytes([out[24 + 8], out[24 + 9]]), 2);
    assert_eq!(out[24 + 60], 0b10);
    let got = read_all(&out).unwrap();
    assert_eq!(got[..3], raw_records()[..]);
}

/// The raw flag means nothing before version 2: a version 1 begin record with it is refused.
#[test]
fn a_raw_flag_in_a_version_1_stream_is_refused() {
    let mut begin = records()[0].encode(0).unwrap();
    begin[24 + 60] |= 0b10;
    let len = begin.len();
    let sum = sluice_format::ChecksumAlg::Xxh3_128.compute(&begin[..len - 16]);
    begin[len - 16..].copy_from_slice(&sum.0);
    let error = read_all(&begin).unwrap_err();
    assert!(error.to_string().contains("begin flags"), "{error}");
}
