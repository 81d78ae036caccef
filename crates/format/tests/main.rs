//! The format crate's integration tests, one module per on-disk structure, built as one test
//! binary (`cargo test -p sluice-format --test format`; a module's tests alone with a filter,
//! `-- crypt::`). One binary links once, where one per file linked six times.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;
mod crypt;
mod format;
mod log_block;
mod raidz;
mod send_stream;
mod vdev_config;
