//! Aligned I/O buffers.
//!
//! O_DIRECT needs the buffer address, the length and the offset aligned to the device's logical
//! block size. One RAII type owns that arithmetic (as Cloud Hypervisor's `aligned_buffer.rs`
//! does): every buffer the engine hands to a device starts on a 4 KiB boundary and is zeroed on
//! allocation, so a short read can never expose stale heap memory. Written by hand because it
//! is one allocation call and a slice view; no crate offers exactly this without pulling in more.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every buffer: the largest logical block size we support (4 KiB sectors).
pub const BUF_ALIGN_BYTES: usize = 4096;

/// An owned, zero-initialised, 4 KiB-aligned byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0 };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (len > 0) and a valid power-of-two alignment.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        AlignedBuf { ptr, len }
    }

    /// A buffer holding a copy of `bytes`. Not zeroed first: every byte is written by the copy
    /// (zeroing cost as much as the copy on the sync path, measured with `perf`).
    pub fn copy_from(bytes: &[u8]) -> AlignedBuf {
        let len = bytes.len();
        if len == 0 {
            return AlignedBuf::zeroed(0);
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size and a valid alignment; the copy initialises all
        // `len` bytes before the buffer is handed out, and the regions cannot overlap (one was
        // just allocated).
        let ptr = unsafe {
            let raw = alloc::alloc(layout);
            let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), len);
            ptr
        };
        AlignedBuf { ptr, len }
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
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size and a valid alignment. The loop writes the bytes
        // before each piece (zeros) and the piece itself, in ascending order, after checking
        // that the piece lies within `len` and after the bytes already written; the tail is
        // zeroed last, so all `len` bytes are initialised before the buffer is handed out.
        unsafe {
            let raw = alloc::alloc(layout);
            let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
            let mut written = 0usize;
            for (at, bytes) in pieces {
                let end = at.checked_add(bytes.len()).filter(|&end| at >= written && end <= len);
                let Some(end) = end else {
                    // Free what was allocated before refusing the caller's broken layout.
                    alloc::dealloc(raw, layout);
                    panic!("AlignedBuf::gathered: piece at {at} of {} bytes does not fit after {written} of {len}", bytes.len());
                };
                std::ptr::write_bytes(raw.add(written), 0, at - written);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), raw.add(at), bytes.len());
                written = end;
            }
            std::ptr::write_bytes(raw.add(written), 0, len - written);
            AlignedBuf { ptr, len }
        }
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, BUF_ALIGN_BYTES) {
            Ok(layout) => layout,
            // Only reachable for lengths near isize::MAX, which no I/O path creates.
            Err(_) => panic!("AlignedBuf: length {len} is too large"),
        }
    }

    pub fn into_shared(self) -> SharedBuf {
        SharedBuf(Arc::new(self))
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr was allocated in `zeroed` with exactly this layout and not freed since.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
        }
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
        // SAFETY: as in deref, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        AlignedBuf::copy_from(self)
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

/// An immutable, reference-counted aligned buffer: one write's data shared by every mirror
/// child and every queue that carries it, without copies.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedBuf(Arc<AlignedBuf>);

impl SharedBuf {
    pub fn copy_from(bytes: &[u8]) -> SharedBuf {
        AlignedBuf::copy_from(bytes).into_shared()
    }

    pub fn len_bytes(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
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
    fn copies_are_equal() {
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        let shared = SharedBuf::copy_from(&data);
        assert_eq!(&shared[..], &data[..]);
        assert_eq!(shared.len_bytes(), 9000);
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
    #[should_panic(expected = "does not fit")]
    fn gathered_refuses_overlapping_pieces() {
        let a = [1u8; 4096];
        let _ = AlignedBuf::gathered(8192, [(0, &a[..]), (2048, &a[..])]);
    }
}
