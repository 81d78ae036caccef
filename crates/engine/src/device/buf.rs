//! Aligned I/O buffers.
//!
//! O_DIRECT needs the buffer address, the length and the offset aligned to the device's logical
//! block size. One RAII type owns that arithmetic (as Cloud Hypervisor's `aligned_buffer.rs`
//! does): every buffer the engine hands to a device starts on a 4 KiB boundary, and every byte
//! of an [`AlignedBuf`] is written before anything can look at it, so a short read can never
//! expose stale heap memory. The buffers that start uninitialised are [`UninitBuf`]s: the one a
//! read fills, which cannot be looked at until the read says how much it wrote (and is zeroed
//! past that), and a partial write's patch of a block, whose uncovered sectors are filled
//! from the version below when the block is built. Written by hand because it is one
//! allocation call and a slice view; no crate offers exactly this without pulling in more.
//!
//! An [`AlignedBuf`] may carry the XXH3-128 of its bytes, taken while a receive had just
//! brought them into the CPU's cache ([`UninitBuf::remember_xxh3`]), for the checksum stage to
//! use instead of reading the block again a txg later; any mutable access forgets it.
//!
//! A [`SharedBuf`] may also be a list of pieces that tile it (`SharedBuf::gather`): a txg sync
//! writes each run of blocks that landed back to back from the blocks' own buffers, as one
//! vectored write, instead of copying them into one buffer first. That copy and the page faults
//! of its fresh buffer were the txg sync's largest cost (perf, 2026-11-24). Devices that take
//! the pieces (the file device's io_uring paths, `IORING_OP_WRITEV`) never join them; anything
//! else that reads the bytes gets them joined once, on first use.
//!
//! Buffers of a block size (a power of two from 4 KiB to 128 KiB) are kept when dropped, up to
//! [`POOL_CLASS_BYTES_MAX`] a size, and the next buffer of that size that starts unwritten
//! takes one back ([`pool`]): an SPDK-style buffer pool in front of the allocator. A 1 MiB
//! write takes 64 buffers of 16 KiB, and the allocator's path for 4 KiB-aligned blocks of
//! that size (a generic one that over-allocates), its page bookkeeping and the page faults
//! after it handed pages back were about 5% of the server's CPU under 1 MiB write + flush
//! (perf, 2026-12-02).
//!
//! The copies these types make into their buffers (`AlignedBuf::copy_from`, `gathered`,
//! `UninitBuf::write_at`) go through [`copy_unaliased`]: on this project's test machines
//! (AMD EPYC, glibc 2.36) a copy of more than about 2 KiB, which glibc makes with `rep movsb`,
//! runs 28 times slower when its destination lies 1 to 15 bytes past its source modulo 4 KiB,
//! and 2.4 times slower at 16 to 31 (8 KiB: 2.3 us against 0.08; docs/bench/peers-notes.md,
//! 2026-12-04). A compressed block, stored after a 4-byte header, was copied that way from
//! the compressor's scratch buffer: 15% of the server's CPU under 1 MiB writes of
//! compressible data.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use sluice_format::{Checksum, ChecksumAlg};

/// Alignment of every buffer: the largest logical block size we support (4 KiB sectors).
pub const BUF_ALIGN_BYTES: usize = 4096;

/// The pieces of a copy [`copy_unaliased`] splits: under the size above which glibc's `memcpy`
/// uses `rep movsb` on CPUs with fast short `rep movsb` (2,112 bytes there).
const COPY_PIECE_BYTES: usize = 2048;
/// How far past its source, modulo a page, a destination makes a `rep movsb` copy slow
/// (measured: 1 to 31 bytes).
const COPY_ALIASING_BYTES: usize = 32;

/// Copies `len` bytes from `src` to `dst`. A copy larger than [`COPY_PIECE_BYTES`] whose
/// destination lies 1 to [`COPY_ALIASING_BYTES`] - 1 bytes past its source modulo 4 KiB
/// ([`copies_in_pieces`]) is made in pieces of that size, which glibc moves with vector loads
/// and stores; any other copy is one `memcpy`. See the module doc for why.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len` bytes, the
/// two not overlapping.
unsafe fn copy_unaliased(src: *const u8, dst: *mut u8, len: usize) {
    if !copies_in_pieces(src, dst, len) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let mut at = 0;
    while at < len {
        let piece = (len - at).min(COPY_PIECE_BYTES);
        // SAFETY: `at + piece <= len`, inside both ranges the caller vouches for.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), piece) };
        at += piece;
    }
}

/// Whether [`copy_unaliased`] copies `len` bytes from `src` to `dst` in pieces.
fn copies_in_pieces(src: *const u8, dst: *mut u8, len: usize) -> bool {
    // Exact for destinations below their source too: 4096 divides 2^64.
    let ahead = (dst as usize).wrapping_sub(src as usize) % 4096;
    len > COPY_PIECE_BYTES && ahead != 0 && ahead < COPY_ALIASING_BYTES
}

/// The most bytes of dropped buffers [`pool`] keeps of each size: 256 blocks of 16 KiB, a
/// quarter of a MiB's worth of 1 MiB writes in flight several times over; 24 MiB over the six
/// sizes at most, small beside the block cache.
pub const POOL_CLASS_BYTES_MAX: usize = 4 << 20;

/// Dropped block-sized buffers kept for reuse (see the module doc). One list per size, each
/// behind its own lock: buffers are taken on the serving cores and mostly dropped by the txg
/// sync and the cache's evictions, so a per-thread cache would fill on one thread and stay
/// empty on the other.
mod pool {
    use std::ptr::NonNull;

    use parking_lot::Mutex;

    use super::POOL_CLASS_BYTES_MAX;

    /// 4 KiB (2^12) to 128 KiB (2^17).
    const SMALLEST_SHIFT: u32 = 12;
    const CLASSES: usize = 6;

    /// A kept buffer's address.
    struct Kept(NonNull<u8>);
    // SAFETY: a kept buffer is owned by the pool alone (nothing else holds its address) until
    // `take` hands it to one new owner.
    unsafe impl Send for Kept {}

    static KEPT: [Mutex<Vec<Kept>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

    fn class(len: usize) -> Option<usize> {
        let shift = len.trailing_zeros();
        let class = shift.checked_sub(SMALLEST_SHIFT)? as usize;
        (len.is_power_of_two() && class < CLASSES).then_some(class)
    }

    /// A kept buffer of exactly `len` bytes (allocated with `AlignedBuf::layout(len)`), if one
    /// is kept; its bytes are whatever its last owner left.
    pub(super) fn take(len: usize) -> Option<NonNull<u8>> {
        KEPT[class(len)?].lock().pop().map(|kept| kept.0)
    }

    /// Keeps a buffer of `len` bytes allocated with `AlignedBuf::layout(len)` and no longer
    /// used; false if it is not of a kept size or its size's list is full (the caller frees
    /// it).
    pub(super) fn keep(ptr: NonNull<u8>, len: usize) -> bool {
        let Some(class) = class(len) else { return false };
        let mut kept = KEPT[class].lock();
        if (kept.len() + 1) * len > POOL_CLASS_BYTES_MAX {
            return false;
        }
        kept.push(Kept(ptr));
        true
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn block_sizes_have_classes_and_nothing_else_does() {
            use super::class;
            assert_eq!(class(4096), Some(0));
            assert_eq!(class(16384), Some(2));
            assert_eq!(class(131072), Some(5));
            for len in [0, 512, 2048, 12288, 20480, 262144, 1 << 20] {
                assert_eq!(class(len), None, "{len}");
            }
        }
    }
}

/// `len` (non-zero) bytes allocated with `AlignedBuf::layout(len)`, not initialised: a kept
/// buffer of that size when there is one.
fn allocate_unwritten(len: usize) -> NonNull<u8> {
    if let Some(ptr) = pool::take(len) {
        return ptr;
    }
    let layout = AlignedBuf::layout(len);
    // SAFETY: layout has a non-zero size (callers pass len > 0) and a valid alignment.
    let raw = unsafe { alloc::alloc(layout) };
    let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
    ptr
}

/// An owned, 4 KiB-aligned byte buffer whose every byte has been written (zeroed, copied or
/// filled).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The XXH3-128 of the bytes, taken while a receive had just brought them into the CPU's
    /// cache ([`UninitBuf::remember_xxh3`]); any mutable access forgets it.
    xxh3: Option<Checksum>,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0, xxh3: None };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, len, xxh3: None }
    }

    /// A buffer holding a copy of `bytes`. Not zeroed first: every byte is written by the copy
    /// (zeroing cost as much as the copy on the sync path, measured with `perf`).
    pub fn copy_from(bytes: &[u8]) -> AlignedBuf {
        let len = bytes.len();
        if len == 0 {
            return AlignedBuf::zeroed(0);
        }
        let ptr = allocate_unwritten(len);
        // SAFETY: the allocation holds `len` bytes; the copy initialises all of them before
        // the buffer is handed out, and the regions cannot overlap (the allocation is ours
        // alone).
        unsafe { copy_unaliased(bytes.as_ptr(), ptr.as_ptr(), len) };
        AlignedBuf { ptr, len, xxh3: None }
    }

    /// A buffer of `len` bytes holding each of `pieces` at its offset and zeros elsewhere.
    /// Every byte is written once: a txg sync builds one buffer per run of blocks this way, and
    /// zeroing the whole run first cost as much as the copies (measured with `perf`, 4 KiB sync
    /// writes). Pieces come in ascending order of offset and must not overlap.
    pub fn gathered<'a>(
        len: usize,
        pieces: impl IntoIterator<Item = (usize, &'a [u8])>,
    ) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf::zeroed(0);
        }
        // SAFETY: the allocation holds `len` bytes. The loop writes the bytes before each
        // piece (zeros) and the piece itself, in ascending order, after checking that the
        // piece lies within `len` and after the bytes already written; the tail is zeroed
        // last, so all `len` bytes are initialised before the buffer is handed out.
        unsafe {
            let ptr = allocate_unwritten(len);
            let raw = ptr.as_ptr();
            let mut written = 0usize;
            for (at, bytes) in pieces {
                let end = at.checked_add(bytes.len()).filter(|&end| at >= written && end <= len);
                let Some(end) = end else {
                    // Free what was allocated before refusing the caller's broken layout.
                    alloc::dealloc(raw, Self::layout(len));
                    panic!("AlignedBuf::gathered: piece at {at} of {} bytes does not fit after {written} of {len}", bytes.len());
                };
                std::ptr::write_bytes(raw.add(written), 0, at - written);
                copy_unaliased(bytes.as_ptr(), raw.add(at), bytes.len());
                written = end;
            }
            std::ptr::write_bytes(raw.add(written), 0, len - written);
            AlignedBuf { ptr, len, xxh3: None }
        }
    }

    /// The XXH3-128 of the bytes if it was taken on arrival ([`UninitBuf::remember_xxh3`]) and
    /// nothing has changed them since: the checksum stage takes it instead of reading the
    /// block again (zio's `sum`).
    pub fn xxh3(&self) -> Option<Checksum> {
        self.xxh3
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, BUF_ALIGN_BYTES) {
            Ok(layout) => layout,
            // Only reachable for lengths near isize::MAX, which no I/O path creates.
            Err(_) => panic!("AlignedBuf: length {len} is too large"),
        }
    }

    pub fn into_shared(self) -> SharedBuf {
        let len = self.len;
        SharedBuf(Arc::new(Shared {
            pieces: Vec::new(),
            parts: Vec::new(),
            iovecs: Vec::new(),
            len,
            whole: OnceLock::from(self),
        }))
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 && !pool::keep(self.ptr, self.len) {
            // SAFETY: ptr was allocated with exactly this layout (`AlignedBuf::layout`) and not
            // freed since (nor kept: `keep` said no).
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
        }
    }
}

/// An aligned buffer whose bytes are not initialised until something writes them: a device's
/// read, or the sectors a partial write covers in a block's patch (txg/dbuf.rs). Zeroing it
/// first was 6% of the server's CPU on uncached 1 MiB reads (perf, 2026-11-25), where the
/// kernel overwrites every byte of a read that completes in full, and 6% of the serving
/// core's at 32 clients of 4 KiB write + flush (perf, 2026-11-26), where a patch's uncovered
/// sectors are filled from the version below. It offers no view of bytes not vouched for:
/// the device gets the address, [`UninitBuf::bytes`] a range its caller wrote, and
/// [`UninitBuf::into_filled`] or [`UninitBuf::assume_init`] turn it into an [`AlignedBuf`]
/// once every byte is written.
pub struct UninitBuf(AlignedBuf);

impl UninitBuf {
    pub fn new(len: usize) -> UninitBuf {
        if len == 0 {
            return UninitBuf(AlignedBuf::zeroed(0));
        }
        // The bytes stay uninitialised (a kept buffer's are a former owner's); nothing reads a
        // byte before a caller vouches it was written (`bytes`, `into_filled`, `assume_init`;
        // no Deref on this type).
        UninitBuf(AlignedBuf { ptr: allocate_unwritten(len), len, xxh3: None })
    }

    pub fn len(&self) -> usize {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Where the device writes (no reference to the uninitialised bytes is made).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.xxh3 = None;
        self.0.ptr.as_ptr()
    }

    /// The bytes from `at` on, for a reader to fill (a socket's: a write's payload received
    /// straight into its blocks, nbd's `read_blocks`); the view claims nothing about them.
    /// What counts as written for [`UninitBuf::bytes`] and [`UninitBuf::assume_init`] is what
    /// a writer initialised through it (tokio's `ReadBuf` over it reports just that).
    pub fn spare(&mut self, at: usize) -> &mut [std::mem::MaybeUninit<u8>] {
        self.check(at, 0);
        self.0.xxh3 = None;
        // SAFETY: the range lies inside the allocation (checked above); MaybeUninit makes no
        // claim on the bytes' contents, and `&mut self` keeps the view exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.0.ptr.as_ptr().add(at).cast::<std::mem::MaybeUninit<u8>>(),
                self.0.len - at,
            )
        }
    }

    /// The buffer, once something wrote its first `filled` bytes; the rest are zeroed here.
    ///
    /// # Safety
    /// The first `filled` bytes must have been written since [`UninitBuf::new`] (a read that
    /// reported `filled` bytes transferred into [`UninitBuf::as_mut_ptr`]).
    pub unsafe fn into_filled(mut self, filled: usize) -> AlignedBuf {
        let filled = filled.min(self.0.len);
        self.fill_at(filled, self.0.len - filled, 0);
        // SAFETY: the caller vouches for the bytes before `filled`; the fill wrote the rest.
        unsafe { self.assume_init() }
    }

    /// Checks that `len` bytes at `at` lie inside the buffer.
    fn check(&self, at: usize, len: usize) {
        let inside = at.checked_add(len).is_some_and(|end| end <= self.0.len);
        assert!(inside, "UninitBuf: {len} bytes at {at} lie outside its {} bytes", self.0.len);
    }

    /// Writes `bytes` at `at`.
    pub fn write_at(&mut self, at: usize, bytes: &[u8]) {
        self.check(at, bytes.len());
        self.0.xxh3 = None;
        // SAFETY: the range lies inside the allocation (checked above), and `bytes` cannot
        // overlap a buffer this value owns exclusively.
        unsafe { copy_unaliased(bytes.as_ptr(), self.0.ptr.as_ptr().add(at), bytes.len()) };
    }

    /// Writes `len` copies of `byte` at `at`.
    pub fn fill_at(&mut self, at: usize, len: usize, byte: u8) {
        self.check(at, len);
        self.0.xxh3 = None;
        // SAFETY: the range lies inside the allocation (checked above).
        unsafe { std::ptr::write_bytes(self.0.ptr.as_ptr().add(at), byte, len) };
    }

    /// The bytes at `range`.
    ///
    /// # Safety
    /// Every byte of `range` must have been written since [`UninitBuf::new`].
    pub unsafe fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        self.check(range.start, range.len());
        // SAFETY: the range lies inside the allocation (checked above) and, the caller
        // vouches, was written; `&self` keeps writers out while the slice lives.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr().add(range.start), range.len()) }
    }

    /// Takes the XXH3-128 of the whole buffer now and keeps it with the buffer, for the txg
    /// sync's checksum stage. A write's payload is received straight into its blocks, and the
    /// sync checksums them a txg later, when they have long left the CPU's caches: XXH3 over
    /// 16 KiB blocks ran at 46 GB/s over bytes just written, 15 GB/s over bytes 8 MiB behind
    /// and 13-14 GB/s over 1 GiB of blocks (23 against 71-79 us per MiB;
    /// docs/bench/peers-notes.md, 2026-12-05), and the sync's checksums were 16% of the
    /// server's CPU under a stream of 1 MiB writes. Any write to the buffer through this type
    /// after this forgets it.
    ///
    /// # Safety
    /// Every byte must have been written since [`UninitBuf::new`], and nothing may write
    /// through a pointer [`UninitBuf::as_mut_ptr`] gave out before this call.
    pub unsafe fn remember_xxh3(&mut self) {
        // SAFETY: the caller vouches for every byte.
        let bytes = unsafe { self.bytes(0..self.0.len) };
        self.0.xxh3 = Some(ChecksumAlg::Xxh3_128.compute(bytes));
    }

    /// The buffer as an [`AlignedBuf`].
    ///
    /// # Safety
    /// Every byte must have been written (initialised) since [`UninitBuf::new`].
    pub unsafe fn assume_init(self) -> AlignedBuf {
        self.0
    }
}

impl fmt::Debug for UninitBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UninitBuf({} bytes)", self.0.len)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zeroed at allocation), or dangling
        // with len 0, which from_raw_parts allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // The caller may change the bytes.
        self.xxh3 = None;
        // SAFETY: as in deref, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut copy = AlignedBuf::copy_from(self);
        copy.xxh3 = self.xxh3;
        copy
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

/// The most pieces one vectored write takes (Linux's `UIO_MAXIOV`); a buffer of more pieces is
/// joined instead.
pub const IOVECS_MAX: usize = 1024;

/// An immutable, reference-counted aligned buffer: one write's data shared by every mirror
/// child and every queue that carries it, without copies. Either one buffer or pieces that
/// tile it (see the module doc).
#[derive(Clone)]
pub struct SharedBuf(Arc<Shared>);

struct Shared {
    /// Pieces in order, back to back; empty for a buffer made whole.
    pieces: Vec<Arc<AlignedBuf>>,
    /// The part of each piece that is this buffer's (all of it, unless made by
    /// [`SharedBuf::gather_parts`]).
    parts: Vec<std::ops::Range<usize>>,
    /// One per piece, pointing into it: what a vectored write hands the kernel.
    iovecs: Vec<libc::iovec>,
    len: usize,
    /// The bytes as one buffer: set at once for a whole buffer, joined on first use for pieces.
    whole: OnceLock<AlignedBuf>,
}

// SAFETY: the iovecs point into `pieces`, which the same value owns and never changes; every
// other field is Send and Sync. Shared access only reads.
unsafe impl Send for Shared {}
// SAFETY: as for Send.
unsafe impl Sync for Shared {}

impl SharedBuf {
    pub fn copy_from(bytes: &[u8]) -> SharedBuf {
        AlignedBuf::copy_from(bytes).into_shared()
    }

    /// A buffer made of `pieces` back to back, each whole 512-byte sectors (each already starts
    /// on a [`BUF_ALIGN_BYTES`] boundary), without copying them.
    pub fn gather(pieces: Vec<Arc<AlignedBuf>>) -> SharedBuf {
        let parts = pieces.into_iter().map(|p| {
            let whole = 0..p.len();
            (p, whole)
        });
        SharedBuf::gather_parts(parts.collect())
    }

    /// As [`SharedBuf::gather`], of parts of buffers: each `(buffer, range)` whole 512-byte
    /// sectors starting on a sector of its buffer (a RAID-Z vdev writes a block's data columns
    /// from the block's own buffer this way, rather than copying each out).
    pub fn gather_parts(parts: Vec<(Arc<AlignedBuf>, std::ops::Range<usize>)>) -> SharedBuf {
        assert!(
            parts.iter().all(|(p, r)| {
                !r.is_empty() && r.end <= p.len() && r.start % 512 == 0 && r.len() % 512 == 0
            }),
            "SharedBuf::gather_parts: every part is whole sectors of its buffer"
        );
        let len = parts.iter().map(|(_, r)| r.len()).sum();
        let iovecs = parts
            .iter()
            .map(|(p, r)| libc::iovec {
                iov_base: p[r.start..].as_ptr() as *mut libc::c_void,
                iov_len: r.len(),
            })
            .collect();
        let (pieces, parts) = parts.into_iter().unzip();
        SharedBuf(Arc::new(Shared { pieces, parts, iovecs, len, whole: OnceLock::new() }))
    }

    /// Bytes held (without joining pieces).
    pub fn len(&self) -> usize {
        self.0.len
    }

    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    pub fn len_bytes(&self) -> u32 {
        u32::try_from(self.0.len).unwrap_or(u32::MAX)
    }

    /// The pieces as a vectored write takes them, if this buffer is pieces (at most
    /// [`IOVECS_MAX`]) not joined yet; `None` means: write it whole.
    pub fn iovecs(&self) -> Option<&[libc::iovec]> {
        let shared = &self.0;
        let unjoined = shared.whole.get().is_none();
        (unjoined && !shared.pieces.is_empty() && shared.pieces.len() <= IOVECS_MAX)
            .then_some(&shared.iovecs[..])
    }

    /// The address of the first byte, without joining pieces: where O_DIRECT's alignment is
    /// checked (every piece starts aligned).
    pub fn addr(&self) -> *const u8 {
        match self.0.pieces.first().zip(self.0.parts.first()) {
            Some((first, part)) if self.0.whole.get().is_none() => first[part.start..].as_ptr(),
            _ => self.as_ptr(),
        }
    }

    /// Whether every piece (or the whole buffer) is a multiple of `align` bytes long.
    pub fn pieces_multiple_of(&self, align: usize) -> bool {
        match self.iovecs() {
            Some(iovecs) => iovecs.iter().all(|v| v.iov_len % align == 0),
            None => self.0.len % align == 0,
        }
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let shared = &self.0;
        shared.whole.get_or_init(|| {
            let mut at = 0;
            AlignedBuf::gathered(
                shared.len,
                shared.pieces.iter().zip(&shared.parts).map(|(p, part)| {
                    let piece = (at, &p[part.clone()]);
                    at += part.len();
                    piece
                }),
            )
        })
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBuf({} bytes in {} pieces)", self.0.len, self.0.pieces.len().max(1))
    }
}

impl PartialEq for SharedBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        for len in [1usize, 512, 4096, 4097, 1 << 20] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
        }
        assert!(AlignedBuf::zeroed(0).is_empty());
    }

    #[test]
    fn a_checksum_taken_on_arrival_lasts_until_the_bytes_change() {
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 31 % 251) as u8).collect();
        let sum = ChecksumAlg::Xxh3_128.compute(&data);
        let received = || {
            let mut block = UninitBuf::new(data.len());
            block.write_at(0, &data);
            block
        };
        // Written, but not summed: none.
        // SAFETY: every byte was written.
        assert_eq!(unsafe { received().assume_init() }.xxh3(), None);
        let mut block = received();
        // SAFETY: every byte was written.
        unsafe { block.remember_xxh3() };
        // SAFETY: every byte was written.
        let block = unsafe { block.assume_init() };
        assert_eq!(block.xxh3(), Some(sum));
        assert_eq!(block.clone().xxh3(), Some(sum), "a copy has the same bytes");
        let mut changed = block.clone();
        changed[0] ^= 1;
        assert_eq!(changed.xxh3(), None, "a mutable borrow forgets it");
        // A write into the buffer before it is handed over forgets it too.
        let mut block = received();
        // SAFETY: every byte was written.
        unsafe { block.remember_xxh3() };
        block.write_at(0, &[0]);
        // SAFETY: every byte was written.
        assert_eq!(unsafe { block.assume_init() }.xxh3(), None);
        let mut block = received();
        // SAFETY: every byte was written.
        unsafe { block.remember_xxh3() };
        let _ = block.spare(16383);
        // SAFETY: every byte was written.
        assert_eq!(unsafe { block.assume_init() }.xxh3(), None);
    }

    #[test]
    fn copies_are_equal() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        let shared = SharedBuf::copy_from(&data);
        assert_eq!(&shared[..], &data[..]);
        assert_eq!(shared.len_bytes(), 9000);
    }

    #[test]
    fn copies_in_pieces_land_every_byte_where_one_copy_would() {
        // Destinations just past their sources (the pieces' case), at them and far from them,
        // for lengths on both sides of a piece and not a multiple of one.
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in [1, 2048, 2049, 8192, 8199] {
            for src_at in [0usize, 3, 64] {
                for ahead in [0usize, 1, 4, 15, 16, 31, 32, 100] {
                    let mut dst = vec![0xeeu8; len + 4096 + 64];
                    let base = dst.as_ptr() as usize;
                    let want = (src.as_ptr() as usize + src_at + ahead) % 4096;
                    let dst_at = (want + 4096 - base % 4096) % 4096;
                    let (from, to) = (src[src_at..].as_ptr(), dst[dst_at..].as_mut_ptr());
                    let pieces =
                        len > COPY_PIECE_BYTES && (1..COPY_ALIASING_BYTES).contains(&ahead);
                    assert_eq!(copies_in_pieces(from, to, len), pieces, "len {len} ahead {ahead}");
                    // SAFETY: both ranges lie inside their vectors, which are distinct.
                    unsafe { copy_unaliased(from, to, len) };
                    assert_eq!(&dst[dst_at..dst_at + len], &src[src_at..src_at + len]);
                    assert!(dst[..dst_at].iter().all(|&b| b == 0xee), "wrote before the copy");
                    assert!(dst[dst_at + len..].iter().all(|&b| b == 0xee), "wrote past it");
                }
            }
        }
    }

    #[test]
    fn gathered_places_pieces_and_zeroes_the_rest() {
        let a = [7u8; 100];
        let b = [9u8; 4096];
        let buf = AlignedBuf::gathered(12288, [(0, &a[..]), (4096, &b[..])]);
        assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        assert_eq!(&buf[..100], &a[..]);
        assert!(buf[100..4096].iter().all(|&x| x == 0));
        assert_eq!(&buf[4096..8192], &b[..]);
        assert!(buf[8192..].iter().all(|&x| x == 0));
        assert!(AlignedBuf::gathered(4096, []).iter().all(|&x| x == 0));
    }

    #[test]
    fn gathered_pieces_read_as_their_bytes_back_to_back() {
        let a = Arc::new(AlignedBuf::copy_from(&[1u8; 4096]));
        let b = Arc::new(AlignedBuf::copy_from(&[2u8; 1024]));
        let shared = SharedBuf::gather(vec![Arc::clone(&a), Arc::clone(&b)]);
        assert_eq!(shared.len(), 5120);
        let iovecs = shared.iovecs().expect("pieces not joined yet");
        assert_eq!(iovecs.len(), 2);
        assert_eq!(iovecs[0].iov_base as *const u8, a.as_ptr());
        assert_eq!((iovecs[1].iov_base as *const u8, iovecs[1].iov_len), (b.as_ptr(), 1024));
        assert_eq!(shared.addr(), a.as_ptr());
        assert!(shared.pieces_multiple_of(1024) && !shared.pieces_multiple_of(4096));
        // Read as bytes: joined once, and from then on written whole.
        assert!(shared[..4096].iter().all(|&x| x == 1) && shared[4096..].iter().all(|&x| x == 2));
        assert!(shared.iovecs().is_none());
        assert_eq!(shared.addr(), shared.as_ptr());
        assert_eq!(shared, SharedBuf::copy_from(&shared[..]));
    }

    #[test]
    #[should_panic(expected = "whole sectors")]
    fn gather_refuses_pieces_of_part_sectors() {
        let _ = SharedBuf::gather(vec![Arc::new(AlignedBuf::zeroed(100))]);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn gathered_refuses_overlapping_pieces() {
        let a = [1u8; 4096];
        let _ = AlignedBuf::gathered(8192, [(0, &a[..]), (2048, &a[..])]);
    }
}
