//! cargo-fuzz target: `cargo +nightly fuzz run nbd_session` from crates/nbd.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
