//! The store on real threads and file leaves, one module per scenario, built as one test
//! binary (`cargo test -p sluice-host --test host`): each binary links the engine, so one
//! binary, not one per file, keeps the test build short.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod file_mirror;
mod shrink_race;
mod store_threads;
