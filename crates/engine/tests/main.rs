//! The engine's integration tests, one module per mechanism under test, built as one test
//! binary (`cargo test -p sluice-engine --test engine`; a module's tests alone with a filter,
//! `-- space::`).
//!
//! One binary, not one per file: each test binary links the engine and instantiates its
//! generic code again, and thirty of them made up most of a clean test build (about 25 s each
//! on a 2-core VM, 2026-12-01).

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

mod add;
mod attach;
mod compression;
mod corruption;
mod dbuf;
mod dedup;
mod durable;
mod encryption;
mod full_pool;
mod import_faults;
mod indirect;
mod intent_log;
mod log_crash;
mod pool;
mod raidz;
mod raidz_pool;
mod reservation;
mod scan;
mod schedule;
mod send_recv;
mod sim_device;
mod snapshot;
mod space;
mod spares;
mod suspend;
mod throttle;
mod txg;
mod vdev;
mod volume;
mod zfetch;
mod zio;
