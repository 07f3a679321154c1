//! f16 x f16 -> f16 GEMM: `C = round(A · B)`, the f32 sums of [`crate::gemm_f16`] rounded to
//! f16 (to nearest even) as they are written.
//!
//! The sums are taken in an f32 buffer of the call's own (kept between calls, so a repeated
//! product allocates nothing), and on the vector ISAs the blocked driver rounds each strip of
//! rows into C as soon as its last k slab has swept it, while the strip is in cache: the
//! product costs what the f32 GEMM does, where a caller rounding a finished f32 block must cut
//! the product into blocks small enough to stay in cache, each packing its operands again.
//! A `parallel` shape cuts itself over the caller's rayon pool as the f32 GEMM does.

use half::f16;

use crate::split::{SharedOperands, for_each_block, parallel_block};
use crate::{GemmDesc, GemmShape, Isa, TileError};

/// `C = A · B` with f16 A, B and C: the f32 result of [`crate::gemm_f16`] on the same ISA,
/// rounded to nearest even ([`crate::convert::f16_from_f32`]).
///
/// `s` means what it means for [`crate::gemm_f16`], except that C is overwritten:
/// `s.accumulate` is refused (an f16 C cannot carry f32 sums between calls). With
/// `s.parallel` the call cuts itself over the current rayon pool; the result is the same.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::InvalidLayout`] for operand `"c"`
/// when `s.accumulate` is set, and the errors of [`crate::gemm_f16`].
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{GemmShape, Isa, gemm_f16_rounded};
///
/// let h = |x: f32| f16::from_f32(x);
/// let a = [h(1.0), h(2.0), h(3.0), h(4.0)]; // [[1, 2], [3, 4]]
/// let b = [h(1.0), h(1.0 / 4096.0), h(0.0), h(1.0)]; // [[1, 1/4096], [0, 1]]
/// let mut c = [f16::NAN; 4]; // not read
/// gemm_f16_rounded(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// // The f32 sums 2 + 1/4096 and 4 + 3/4096 are not f16 values: they round to 2 and 4.
/// assert_eq!(c, [h(1.0), h(2.0), h(3.0), h(4.0)]);
/// # Ok::<(), uopc_tile::TileError>(())
/// ```
pub fn gemm_f16_rounded(
    isa: Isa,
    s: &GemmShape,
    a: &[f16],
    b: &[f16],
    c: &mut [f16],
) -> Result<(), TileError> {
    if s.accumulate {
        return Err(TileError::InvalidLayout {
            operand: "c",
            reason: "an f16 C is overwritten, not accumulated",
        });
    }
    crate::gemm::check_operands(isa, s, [a.len(), b.len(), c.len()], crate::gemm::BPanels::None)?;
    // SAFETY: the ISA is available, each slice covers its operand's extent, `c` is a unique
    // borrow (so it overlaps neither operand) and the shape overwrites C.
    unsafe { gemm_f16_rounded_unchecked(isa, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// [`gemm_f16_rounded`] on raw pointers, without checks.
///
/// # Safety
///
/// The contract of [`crate::gemm_f16_unchecked`], with `c` valid for writes of f16, `!s.accumulate`
/// and B not in panels.
pub unsafe fn gemm_f16_rounded_unchecked(isa: Isa, s: &GemmShape, a: *const f16, b: *const f16, c: *mut f16) {
    if !s.parallel {
        // SAFETY: forwarded from this function's contract.
        unsafe { serial(isa, s, a, b, c) };
        return;
    }
    let threads = rayon::current_num_threads();
    let block = parallel_block(s.m, s.n, s.k, threads, crate::machine::register_tile(isa));
    let ops = SharedOperands(a, b, c);
    for_each_block(s, block, |sub, (a_at, b_at, c_at)| {
        // SAFETY: the sub-shape is a block of rows or columns of `s` with the same leading
        // dimensions, and the offsets move A, B and C to that block's first element, so its
        // extents lie inside the ones the caller guarantees; blocks of C are disjoint.
        unsafe {
            let (a, b, c) = ops.get();
            serial(isa, &sub, a.add(a_at), b.add(b_at), c.add(c_at));
        }
    });
}

/// [`gemm_f16_rounded_unchecked`] on the calling thread.
///
/// # Safety
///
/// As [`gemm_f16_rounded_unchecked`].
unsafe fn serial(isa: Isa, s: &GemmShape, a: *const f16, b: *const f16, c: *mut f16) {
    // SAFETY: forwarded from this function's contract.
    if unsafe { crate::f16_gemm::drive_rounded(isa, s, a, b, c) } {
        return;
    }
    // SAFETY: forwarded from this function's contract; the f32 GEMM writes the call's own
    // buffer.
    unsafe { rounded_whole(s, c, |dense, sums| crate::gemm_f16_unchecked(isa, dense, a, b, sums)) };
}

/// A rounded product's fallback: `gemm` writes the f32 sums of `s` into an f32 buffer of the
/// call's own (a kept buffer, `m x n` at stride `n`, the shape it is given), which is then
/// rounded into the 16-bit C at `c` whole.
///
/// # Safety
///
/// `c` is valid for writes of `s`'s C extent of `D`, and `gemm` writes the whole `m x n` block
/// at the pointer it is given and nothing else.
pub(crate) unsafe fn rounded_whole<D>(s: &GemmShape, c: *mut D, gemm: impl FnOnce(&GemmShape, *mut f32))
where
    f32: crate::convert::BlockConversion<D>,
{
    let (m, n) = (s.m, s.n);
    if m == 0 || n == 0 {
        return;
    }
    let mut sums = crate::memory::overwritten_f32(m * n);
    gemm(&GemmShape { ldc: n, accumulate: false, parallel: false, ..*s }, sums.as_mut_ptr());
    // SAFETY: C's extent, `m` rows of `n` at stride `ldc`, is writable (this function's
    // contract).
    let c = unsafe { std::slice::from_raw_parts_mut(c, (m - 1) * s.ldc + n) };
    // The extents are exact, so this cannot fail.
    let _ = crate::convert::convert_block(m, n, &sums, n, c, s.ldc);
    crate::memory::keep_f32(sums);
}

/// Flat C-ABI [`gemm_f16_rounded`] for JIT-compiled code, on the fastest ISA here.
///
/// Arguments, in order: `a`, `b`, `c` (pointers to f16 bit patterns), then the `i64`s `m`,
/// `n`, `k`, `lda`, `ldb`, `ldc`, `flags`, as for [`crate::uopc_tile_gemm_f32`].
///
/// Returns 0 on success, or -1 without touching memory when [`crate::uopc_tile_gemm_f16`]
/// would, or when `flags` asks to accumulate.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f16_rounded_unchecked`] for the decoded
/// shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f16_rounded(
    a: *const f16,
    b: *const f16,
    c: *mut f16,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    flags: i64,
) -> i32 {
    let desc = GemmDesc { m, n, k, lda, ldb, ldc, flags };
    // SAFETY: `desc` is a local descriptor.
    let Some(s) = (unsafe { crate::gemm::decode_rounded(&desc, [a.is_null(), b.is_null(), c.is_null()]) })
    else {
        return -1;
    };
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { gemm_f16_rounded_unchecked(Isa::detect(), &s, a, b, c) };
    0
}
