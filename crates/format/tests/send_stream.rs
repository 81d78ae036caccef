//! Send streams: records round-trip; a stream that is damaged, cut short, reordered or newer
//! than this build is refused at the record where it goes wrong, naming it.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use sluice_format::{
    BlockCompression, ResumeToken, StreamBegin, StreamError, StreamReader, StreamRecord,
    StreamWriter, TokenError,
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
    assert!(matches!(error, StreamError::NewerVersion { found: 9, newest: 1 }), "{error}");
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
