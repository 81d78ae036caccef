//! On-disk types only: labels, uberblocks, block pointers, log blocks and dedup entries.
//!
//! Every structure here is little-endian with a magic number, a version and a checksum, and its
//! decoder never panics. The pool issue fills this crate; the I/O layer below it needs only the
//! sector size every on-disk structure is a whole number of.

/// Every on-disk structure is a whole number of these.
pub const SECTOR_BYTES: u32 = 512;

const _: () = assert!(SECTOR_BYTES.is_power_of_two());
