//! Stable-toolchain smoke run of the fuzz target's corpus (crates/nbd/fuzz): every seed
//! session, then deterministic mutations of them (bytes flipped, cut short, spliced), through
//! the same harness the fuzzer uses. Nothing may panic or hang, and the sessions that are
//! valid must get the answers a client expects.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/nbd_session");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 8, "corpus at {} is missing", dir.display());
    files
}

#[test]
fn corpus_sessions_run() {
    for (name, input) in corpus() {
        let output = harness::run(&input);
        // Every session starts with the server's greeting.
        assert!(output.starts_with(b"NBDMAGIC"), "{name}: no greeting");
        if name == "go_simple_rw" {
            // Write, read, flush: three simple replies, and the data read back.
            let replies = &output[18..];
            let simple = replies.windows(4).filter(|w| *w == [0x67, 0x44, 0x66, 0x98]).count();
            assert!(simple >= 3, "{name}: {simple} simple replies");
            assert!(replies.windows(64).any(|w| w.iter().all(|&b| b == 0xab)), "{name}: data");
        }
    }
}

#[test]
fn mutated_sessions_never_panic() {
    let seeds = corpus();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..300 {
        let (_, base) = &seeds[(next() % seeds.len() as u64) as usize];
        let mut input = base.clone();
        match round % 3 {
            0 => {
                for _ in 0..1 + next() % 8 {
                    if input.is_empty() {
                        break;
                    }
                    let at = (next() % input.len() as u64) as usize;
                    input[at] ^= 1 << (next() % 8);
                }
            }
            1 => input.truncate((next() % (input.len() as u64 + 1)) as usize),
            _ => {
                let (_, other) = &seeds[(next() % seeds.len() as u64) as usize];
                let cut = (next() % (input.len() as u64 + 1)) as usize;
                let from = (next() % (other.len() as u64 + 1)) as usize;
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
        }
        harness::run(&input);
    }
}
