//! The process's memory allocator: mimalloc, and the one option the server changes.
//!
//! Each binary that serves or measures the engine (`sluice`, `sluice-bench`) declares
//! `mimalloc::MiMalloc` its global allocator (a static only a binary can hold) and calls
//! [`tune`] first thing, so that a benchmark's figures are the server's.
//!
//! Why mimalloc: glibc's malloc spent 13% of the server's CPU at 32 clients of 4 KiB
//! write + flush (perf, 2026-11-26), most of it aligned allocation (`_int_memalign`) and the
//! coalescing of free chunks it causes (`unlink_chunk`): the write path allocates 16 KiB block
//! buffers aligned to 4 KiB on the serving core, and the txg sync frees them on another.
//! mimalloc (the crate builds its v3) keeps per-thread pages of each size class and returns a
//! free from another thread to the owning page without a lock.

/// mimalloc's `purge_decommits` option (its place in `mi_option_e`, mimalloc.h of the v3 that
/// libmimalloc-sys 0.1.49 builds; the crate is pinned to that version in Cargo.toml for this).
const MI_OPTION_PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Memory mimalloc no longer uses is handed back with `MADV_FREE` rather than `MADV_DONTNEED`.
///
/// A serving process frees block buffers as fast as it allocates them: a txg sync frees the
/// versions its blocks replaced, the block cache evicts. mimalloc purges a page a second after
/// it empties, by default with `MADV_DONTNEED`, so the next buffer placed there faults the page
/// back and the kernel clears it: under 1 MiB sync writes, 16% of the server's samples were
/// `clear_page_erms` under the write path's buffer copies (perf, 2026-11-27). With `MADV_FREE`
/// the page stays mapped until the kernel needs the memory, and a page reused before then
/// costs nothing: 1,759-1,866 against 2,227-2,308 us of CPU per 1 MiB write and flush in
/// alternating rounds (docs/bench/peers-notes.md). The process's RSS then counts freed memory
/// until the kernel reclaims it (`LazyFree` in smaps), which it does under pressure.
/// `MIMALLOC_PURGE_DECOMMITS` in the environment still wins.
pub fn tune() {
    // SAFETY: sets one option's value; mimalloc reads it at each purge. Called before any other
    // thread exists.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DECOMMITS, 0) };
}
