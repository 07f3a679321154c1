//! bf16 x bf16 -> bf16 GEMM: `C = round(A · B)`, the f32 sums of [`crate::gemm_bf16`] rounded
//! to bf16 (to nearest even) as they are written.
//!
//! On AMX, when all of k fits the driver's one slab, each 32 x 32 block is rounded from a
//! local f32 block right after its k loop, so the product needs no f32 C at all and its
//! callers need no f32 scratch to cut the product into small blocks for. On the paths that
//! widen bf16 into the f32 blocked driver, that driver rounds each strip of rows as soon as its
//! sums are final, while it is in cache ([`crate::blocked::drive_rounded`]). Elsewhere the
//! sums go through an f32 buffer of the call's own and are rounded row by row at the end.

use half::bf16;

use crate::bf16_path::Bf16Path;
use crate::{GemmDesc, GemmShape, TileError};

/// `C = A · B` with bf16 A, B and C: the f32 result of [`crate::gemm_bf16`] on the same path,
/// rounded to nearest even ([`crate::convert::bf16_from_f32`]), bit for bit.
///
/// `s` means what it means for [`crate::gemm_bf16`], except that C is overwritten:
/// `s.accumulate` is refused (a bf16 C cannot carry f32 sums between calls).
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::InvalidLayout`] for operand `"c"`
/// when `s.accumulate` is set, and the errors of [`crate::gemm_bf16`].
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{Bf16Path, GemmShape, gemm_bf16_rounded};
///
/// let h = |x: f32| bf16::from_f32(x);
/// let a = [h(1.0), h(2.0), h(3.0), h(4.0)]; // [[1, 2], [3, 4]]
/// let b = [h(1.0), h(1.0 / 256.0), h(0.0), h(1.0)]; // [[1, 1/256], [0, 1]]
/// let mut c = [bf16::NAN; 4]; // not read
/// gemm_bf16_rounded(Bf16Path::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// // The f32 sums 2 + 1/256 and 4 + 3/256 are not bf16 values: they round to 2 and 4.
/// assert_eq!(c, [h(1.0), h(2.0), h(3.0), h(4.0)]);
/// # Ok::<(), uopc_tile::TileError>(())
/// ```
pub fn gemm_bf16_rounded(
    path: Bf16Path,
    s: &GemmShape,
    a: &[bf16],
    b: &[bf16],
    c: &mut [bf16],
) -> Result<(), TileError> {
    if s.accumulate {
        return Err(TileError::InvalidLayout {
            operand: "c",
            reason: "a bf16 C is overwritten, not accumulated",
        });
    }
    crate::bf16_gemm::check(path, s, a.len(), b.len(), c.len())?;
    // SAFETY: the path is available, each slice covers its operand's extent, `c` is a unique
    // borrow (so it overlaps neither operand) and the shape overwrites C.
    unsafe { gemm_bf16_rounded_unchecked(path, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// [`gemm_bf16_rounded`] on raw pointers, without checks.
///
/// # Safety
///
/// The contract of [`crate::gemm_bf16_unchecked`], with `c` valid for writes of bf16 and
/// `!s.accumulate`.
pub unsafe fn gemm_bf16_rounded_unchecked(
    path: Bf16Path,
    s: &GemmShape,
    a: *const bf16,
    b: *const bf16,
    c: *mut bf16,
) {
    if path == Bf16Path::Amx {
        // SAFETY: forwarded; bf16 is a transparent u16.
        if unsafe { crate::bf16_blocked::drive_rounded(path, s, a.cast(), b.cast(), c.cast()) } {
            return;
        }
    }
    // SAFETY: forwarded.
    if unsafe { widened_rounded(path, s, a, b, c) } {
        return;
    }
    // SAFETY: forwarded; the f32 GEMM writes the call's own buffer.
    unsafe {
        crate::f16_rounded::rounded_whole(s, c, |dense, sums| {
            crate::gemm_bf16_unchecked(path, dense, a, b, sums)
        })
    };
}

/// On a path that widens bf16 into the f32 blocked driver, that driver's own rounding of each
/// strip into `c` once its sums are final ([`crate::f16_gemm::drive_rounded`]); `false`, with
/// nothing read or written, on any other path or where the driver does not take the shape.
///
/// # Safety
///
/// The contract of [`gemm_bf16_rounded_unchecked`].
unsafe fn widened_rounded(
    path: Bf16Path,
    s: &GemmShape,
    a: *const bf16,
    b: *const bf16,
    c: *mut bf16,
) -> bool {
    let isa = match path {
        Bf16Path::Avx512Widen => crate::Isa::Avx512,
        Bf16Path::Avx2Fma => crate::Isa::Avx2Fma,
        _ => return false,
    };
    // SAFETY: the path is available, so its ISA is; the rest is forwarded.
    unsafe { crate::f16_gemm::drive_rounded(isa, s, a, b, c) }
}

/// Flat C-ABI [`gemm_bf16_rounded`] for JIT-compiled code, on the fastest path here.
///
/// Arguments, in order: `a`, `b`, `c` (pointers to bf16 bit patterns), then the `i64`s `m`,
/// `n`, `k`, `lda`, `ldb`, `ldc`, `flags`, as for [`crate::uopc_tile_gemm_f32`].
///
/// Returns 0 on success, or -1 without touching memory when [`crate::uopc_tile_gemm_bf16`]
/// would, or when `flags` asks to accumulate.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_bf16_rounded_unchecked`] for the decoded
/// shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_bf16_rounded(
    a: *const bf16,
    b: *const bf16,
    c: *mut bf16,
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
    // SAFETY: the detected path is available; extents and pointers are the caller's contract.
    unsafe { gemm_bf16_rounded_unchecked(Bf16Path::detect(), &s, a, b, c) };
    0
}
