//! Large buffers on huge pages.
//!
//! A GEMM sweeps its output and packed operands tile by tile; with 4 KiB pages the rows of a
//! wide matrix each sit on their own page, so every tile misses the TLB once per row. On Linux
//! with transparent huge pages in `madvise` mode (the common default) a buffer gets 2 MiB pages
//! only if it asks before it is first touched, which is what [`advise_huge_pages`] does and
//! what [`uninit_f32`] does for a fresh buffer. Elsewhere both are plain allocations.

use std::mem::MaybeUninit;

/// Buffers of at least this many bytes ask for huge pages: smaller ones span few pages, and
/// the system call would cost more than the TLB misses it saves.
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// Asks the kernel to back the whole 4 KiB pages of `buf` with transparent huge pages.
///
/// Advice only: the contents and validity of the memory do not change, and nothing happens for
/// buffers below [`HUGE_PAGE_MIN_BYTES`], off Linux, or when the kernel declines. Pages already
/// touched keep their size until the kernel's background collapse reaches them, so call it
/// before first writing a fresh buffer.
pub fn advise_huge_pages<T>(buf: &[T]) {
    let bytes = std::mem::size_of_val(buf);
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (buf.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (buf.as_ptr() as usize + bytes) / PAGE * PAGE;
        if end > start {
            // SAFETY: `[start, end)` is whole pages inside `buf`'s allocation, which this
            // process owns; MADV_HUGEPAGE changes only how the pages are backed, never their
            // contents, so no reference to the memory is invalidated. A failure is ignored: the
            // buffer then stays on small pages, which is correct, only slower.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// `len` uninitialized f32s, asked onto huge pages ([`advise_huge_pages`]) before any is
/// touched.
pub fn uninit_f32(len: usize) -> Vec<MaybeUninit<f32>> {
    let mut v: Vec<MaybeUninit<f32>> = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` needs no initialization, and the capacity is `len`.
    unsafe { v.set_len(len) };
    advise_huge_pages(&v);
    v
}

/// `len` zeros (`T::default()`), asked onto huge pages ([`advise_huge_pages`]).
///
/// The zeros of the primitive types come from `calloc`, whose large blocks are fresh pages
/// the kernel zeroes on first touch, so the advice still comes before any page is touched and
/// nothing is written twice.
pub fn zeroed<T: Clone + Default>(len: usize) -> Vec<T> {
    let v = vec![T::default(); len];
    advise_huge_pages(&v);
    v
}

/// `len` copies of `value`, the memory asked onto huge pages ([`advise_huge_pages`]) before it
/// is filled.
pub fn filled<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(v.spare_capacity_mut());
    v.resize(len, value);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advised_buffers_keep_their_contents() {
        let len = HUGE_PAGE_MIN_BYTES / 4 + 1000;
        let mut v = filled(len, 1.5f32);
        assert_eq!(v.len(), len);
        assert!(v.iter().all(|&x| x == 1.5));
        v[len - 1] = 2.0;
        advise_huge_pages(&v);
        assert_eq!(v[len - 1], 2.0);
        assert!(v[..len - 1].iter().all(|&x| x == 1.5));
        let u = uninit_f32(len);
        assert_eq!(u.len(), len);
        // Small buffers are left alone, and empty ones are fine.
        advise_huge_pages::<f32>(&[]);
        assert_eq!(filled(3, 7u8), vec![7, 7, 7]);
        let z: Vec<f32> = zeroed(len);
        assert!(z.len() == len && z.iter().all(|&x| x == 0.0));
    }
}
