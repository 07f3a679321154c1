//! Large buffers on huge pages, and large f32 buffers kept for reuse.
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

/// `len` uninitialized f32s: a kept buffer ([`keep_f32`]) when one fits,
/// otherwise fresh memory asked onto huge pages ([`advise_huge_pages`]) before any is touched.
pub fn uninit_f32(len: usize) -> Vec<MaybeUninit<f32>> {
    uninit_from(&KEPT_F32, len)
}

/// [`uninit_f32`] for a 16-bit element type, from the buffers [`keep_16bit`] kept (u16, bf16
/// and f16 share them).
pub fn uninit_16bit<T: Bits16>(len: usize) -> Vec<MaybeUninit<T>> {
    // SAFETY: `T` has u16's size and alignment (`Bits16`); the elements stay uninitialized.
    unsafe { recast(uninit_from(&KEPT_U16, len)) }
}

/// `v`'s allocation and elements as a vector of `U`.
///
/// # Safety
///
/// `U` has `T`'s size and alignment (so the allocation's layout is unchanged), and each of
/// `v`'s elements is a valid `U`.
unsafe fn recast<T, U>(v: Vec<T>) -> Vec<U> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: the pointer, length and capacity are the vector's own; the rest is this
    // function's contract.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<U>(), v.len(), v.capacity()) }
}

/// The 16-bit element types whose buffers [`keep_16bit`] keeps together: u16 and the
/// transparent wrappers of its bit patterns, bf16 and f16 (sealed).
pub trait Bits16: Copy + bits16::Sealed {}
impl Bits16 for u16 {}
impl Bits16 for half::bf16 {}
impl Bits16 for half::f16 {}

mod bits16 {
    pub trait Sealed {}
    impl Sealed for u16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// `len` uninitialized elements: a buffer kept in `pool` when one fits, otherwise fresh memory
/// asked onto huge pages.
fn uninit_from<T: Copy + Default>(pool: &Pool<T>, len: usize) -> Vec<MaybeUninit<T>> {
    if let Some(kept) = pool.reuse(len) {
        // SAFETY: MaybeUninit<T> has T's size and alignment, and initialized values are valid
        // MaybeUninits.
        return unsafe { recast(kept) };
    }
    let mut v: Vec<MaybeUninit<T>> = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` needs no initialization, and the capacity is `len`.
    unsafe { v.set_len(len) };
    advise_huge_pages(&v);
    v
}

/// `len` f32s whose values are unspecified (a kept buffer's old values, or zeros), for a
/// caller that writes every one before reading it: a kept buffer ([`keep_f32`]) when one fits,
/// otherwise fresh zeros ([`zeroed`]).
pub fn overwritten_f32(len: usize) -> Vec<f32> {
    KEPT_F32.reuse(len).unwrap_or_else(|| zeroed(len))
}

/// `len` f32 zeros, in a kept buffer ([`keep_f32`]) when one fits.
pub fn zeroed_f32(len: usize) -> Vec<f32> {
    match KEPT_F32.reuse(len) {
        Some(mut v) => {
            v.fill(0.0);
            v
        }
        None => zeroed(len),
    }
}

/// f32 and 16-bit buffers of at least this many bytes are kept for reuse when they are dropped: below it
/// the allocator's own free lists serve reuse, above it every allocation is fresh pages from
/// the kernel, zeroed (and on many virtual machines supplied again by the host) page by page.
pub const KEPT_MIN_BYTES: usize = 1 << 20;

/// The most bytes kept at once of each element type: buffers beyond it are freed as usual.
pub const KEPT_MAX_BYTES: usize = 2 << 30;

/// Large buffers of one element type dropped and kept for the next allocations they fit (a
/// training step or a prompt allocates the buffers the last one dropped), and the bytes they
/// hold.
struct Pool<T>(std::sync::Mutex<(Vec<Vec<T>>, usize)>);

static KEPT_F32: Pool<f32> = Pool(std::sync::Mutex::new((Vec::new(), 0)));
static KEPT_U16: Pool<u16> = Pool(std::sync::Mutex::new((Vec::new(), 0)));

impl<T: Copy + Default> Pool<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<Vec<T>>, usize)> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `v` when it is at least [`KEPT_MIN_BYTES`] and the pool stays within
    /// [`KEPT_MAX_BYTES`]; otherwise frees it.
    fn keep(&self, v: Vec<T>) {
        let bytes = v.capacity() * size_of::<T>();
        if bytes < KEPT_MIN_BYTES {
            return;
        }
        let mut kept = self.lock();
        if kept.1 + bytes <= KEPT_MAX_BYTES {
            kept.1 += bytes;
            kept.0.push(v);
        }
    }

    /// The kept buffer of the least capacity that holds `len` elements without more than
    /// doubling them, resized to `len`, if any.
    fn reuse(&self, len: usize) -> Option<Vec<T>> {
        if len * size_of::<T>() < KEPT_MIN_BYTES {
            return None;
        }
        let mut kept = self.lock();
        let fits = |v: &Vec<T>| (len..=2 * len).contains(&v.capacity());
        let (at, _) = kept.0.iter().enumerate().filter(|(_, v)| fits(v)).min_by_key(|(_, v)| v.capacity())?;
        let mut v = kept.0.swap_remove(at);
        kept.1 -= v.capacity() * size_of::<T>();
        drop(kept);
        // Within the capacity: no allocation; the old values stay where they are.
        v.truncate(len);
        v.resize(len, T::default());
        Some(v)
    }

    fn release(&self) {
        drop(std::mem::take(&mut *self.lock()));
    }
}

/// Keeps `v` for reuse by [`uninit_f32`], [`overwritten_f32`] and [`zeroed_f32`] when it is
/// at least [`KEPT_MIN_BYTES`] and the kept f32 bytes stay within [`KEPT_MAX_BYTES`];
/// otherwise frees it. Its values are never read again, only overwritten.
pub fn keep_f32(v: Vec<f32>) {
    KEPT_F32.keep(v);
}

/// [`keep_f32`] for a 16-bit element type, for [`uninit_16bit`].
pub fn keep_16bit<T: Bits16>(v: Vec<T>) {
    // SAFETY: `T` has u16's size and alignment (`Bits16`), and every bit pattern is a valid u16.
    KEPT_U16.keep(unsafe { recast(v) });
}

/// Frees every kept buffer, returning their memory to the system.
pub fn release_kept() {
    KEPT_F32.release();
    KEPT_U16.release();
}

/// Bytes held by kept buffers.
pub fn kept_bytes() -> usize {
    KEPT_F32.lock().1 + KEPT_U16.lock().1
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

    #[test]
    fn dropped_large_buffers_serve_the_next_ones_of_their_type_that_fit() {
        let len = KEPT_MIN_BYTES / 4 * 3 + 17;
        let v = vec![1.5f32; len];
        let at = v.as_ptr();
        keep_f32(v);
        // A smaller request it holds without doubling: the same memory, zeroed when asked.
        let z = zeroed_f32(len - 5);
        assert_eq!(z.as_ptr(), at);
        assert!(z.len() == len - 5 && z.iter().all(|&x| x == 0.0));
        keep_f32(z);
        let u = uninit_f32(len);
        assert_eq!(u.as_ptr().cast::<f32>(), at);
        drop(u);
        // A request it would more than double is not served from it.
        let big = vec![2.0f32; len];
        let big_at = big.as_ptr();
        keep_f32(big);
        let small = overwritten_f32(len / 3);
        assert!(small.len() == len / 3 && small.as_ptr() != big_at);
        let w = overwritten_f32(len);
        assert_eq!(w.len(), len);
        // 16-bit buffers are kept apart from f32 ones, and serve only 16-bit requests.
        let halves = vec![7u16; len];
        let halves_at = halves.as_ptr();
        keep_16bit(halves);
        let f = uninit_f32(len / 2);
        assert_ne!(f.as_ptr().cast::<u16>(), halves_at);
        let h = uninit_16bit::<u16>(len - 3);
        assert!(h.len() == len - 3 && h.as_ptr().cast::<u16>() == halves_at);
        // Buffers below the threshold are freed, not kept.
        let before = kept_bytes();
        keep_f32(vec![0.0f32; 16]);
        keep_16bit(vec![0u16; 16]);
        assert_eq!(kept_bytes(), before);
        release_kept();
        assert_eq!(kept_bytes(), 0);
    }
}
