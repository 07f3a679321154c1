//! The elementwise tile steps of the FlashAttention-2 backward pass, in the log2 domain: the
//! probabilities recomputed from the forward's log-sum-exp ([`softmax_recompute`]) and the
//! softmax gradient `dS = P * (dP - Delta)` ([`softmax_grad`]).
//!
//! Both work on `rows x cols` score tiles with row stride `ld` and one per-row scalar, and
//! both have an AVX-512 path and a portable one (the AVX2+FMA ISA runs the portable loop: on
//! these steps it is memory-light scalar work the compiler vectorizes to 256 bits anyway).

use crate::error::check_len;
pub use crate::shapes::ScoreTileShape;
use crate::softmax::exp2_scalar;
use crate::{Isa, TileError};

/// The probabilities of a score tile recomputed from the per-row log-sum-exp, in place.
///
/// For each row `r`: `S[r, j] = exp2(S[r, j] - lse[r])`, where `S` holds base-2 scores (the
/// scaled `q · k` times `log2(e)`, masked entries `-inf`) and `lse[r]` is the row's base-2
/// log-sum-exp over every key it sees (what the forward pass saved). A row with
/// `lse[r] == -inf` saw no key at all: its probabilities are defined as 0 (instead of
/// `exp2(-inf - -inf)`, NaN), so fully masked rows get zero gradients.
///
/// NaN and infinities: a `-inf` score gives exactly 0; a NaN score or a NaN `lse` gives NaN (a
/// NaN that reached the forward's row reaches its gradients too); `S = +inf` with a finite
/// `lse` gives `+inf`. `exp2` is the one of [`crate::softmax_update`], with the same accuracy
/// ([`crate::EXP2_MAX_REL_ERROR`] relative over `[-126, 0]`).
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; the errors of [`ScoreTileShape::extent`]; [`TileError::BufferTooSmall`] if `s` or
/// `lse` (which needs `rows` elements) is too short.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, ScoreTileShape, TileError, softmax_recompute};
///
/// // Row 0 saw keys with base-2 scores 1 and 0: lse = log2(2^1 + 2^0) = log2(3).
/// // Row 1 saw no key (every score -inf, lse -inf).
/// let inf = f32::INFINITY;
/// let mut s = [1.0, 0.0, -inf, -inf];
/// let lse = [3f32.log2(), -inf];
/// softmax_recompute(Isa::detect(), &ScoreTileShape::dense(2, 2), &mut s, &lse)?;
/// assert!((s[0] - 2.0 / 3.0).abs() < 1e-6 && (s[1] - 1.0 / 3.0).abs() < 1e-6);
/// assert_eq!(&s[2..], &[0.0, 0.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn softmax_recompute(isa: Isa, sh: &ScoreTileShape, s: &mut [f32], lse: &[f32]) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("s", sh.extent()?, s.len())?;
    check_len("lse", sh.rows, lse.len())?;
    // SAFETY: the ISA is available, both slices cover their extents, and `s` is a unique borrow.
    unsafe { softmax_recompute_unchecked(isa, sh, s.as_mut_ptr(), lse.as_ptr()) };
    Ok(())
}

/// [`softmax_recompute`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * `sh.extent()` is `Ok(n)`, `s` is valid for reads and writes of `n` f32s and `lse` for
///   reads of `sh.rows`; both aligned for `f32` (null is fine for an extent of 0).
/// * The two regions are disjoint and nothing else writes them during the call.
pub unsafe fn softmax_recompute_unchecked(isa: Isa, sh: &ScoreTileShape, s: *mut f32, lse: *const f32) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512 is available and the buffer extents.
        Isa::Avx512 => unsafe { crate::x86::avx512::softmax_recompute(sh, s, lse) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX2 and FMA are available and the buffer extents.
        Isa::Avx2Fma => unsafe { crate::x86::avx2::softmax_recompute(sh, s, lse) },
        // SAFETY: the caller guarantees the buffer extents; no CPU features are needed.
        _ => unsafe { recompute_portable(sh, s, lse) },
    }
}

/// The softmax gradient of a tile, in place: `dP[r, j] = P[r, j] * (dP[r, j] - delta[r])`.
///
/// `P` holds the probabilities ([`softmax_recompute`]), `dP = dO · V^T` the gradient arriving
/// at them, and `delta[r] = sum_j P[r, j] dP[r, j]` (which equals `dO_r · O_r`); the result is
/// the gradient at the scores, `dS`. Where `P[r, j] == 0` (a masked key, a row that saw no
/// key, or an underflowed probability) the result is exactly 0, whatever `dP` holds: such a
/// key does not take part in the softmax, so an infinite or NaN value row behind it must not
/// turn into a NaN gradient. A NaN `P` or a NaN `dP` or `delta` where `P != 0` gives NaN.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; the errors of [`ScoreTileShape::extent`]; [`TileError::BufferTooSmall`] if `p`,
/// `dp` or `delta` (which needs `rows` elements) is too short.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, ScoreTileShape, TileError, softmax_grad};
///
/// let p = [0.75, 0.25, 0.0];
/// let mut dp = [2.0, -2.0, f32::NAN]; // the third key is masked: its NaN does not leak
/// let delta = [0.75 * 2.0 - 0.25 * 2.0];
/// softmax_grad(Isa::detect(), &ScoreTileShape::dense(1, 3), &p, &mut dp, &delta)?;
/// assert_eq!(dp, [0.75 * (2.0 - 1.0), 0.25 * (-2.0 - 1.0), 0.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn softmax_grad(
    isa: Isa,
    sh: &ScoreTileShape,
    p: &[f32],
    dp: &mut [f32],
    delta: &[f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let n = sh.extent()?;
    check_len("p", n, p.len())?;
    check_len("dp", n, dp.len())?;
    check_len("delta", sh.rows, delta.len())?;
    // SAFETY: the ISA is available, the slices cover their extents, and `dp` is a unique borrow
    // (so it overlaps neither `p` nor `delta`).
    unsafe { softmax_grad_unchecked(isa, sh, p.as_ptr(), dp.as_mut_ptr(), delta.as_ptr()) };
    Ok(())
}

/// [`softmax_grad`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * `sh.extent()` is `Ok(n)`, `p` is valid for reads of `n` f32s, `dp` for reads and writes
///   of `n`, `delta` for reads of `sh.rows`; all aligned for `f32` (null is fine for an
///   extent of 0).
/// * The `dp` region overlaps neither other region, and nothing else accesses it during the call.
pub unsafe fn softmax_grad_unchecked(
    isa: Isa,
    sh: &ScoreTileShape,
    p: *const f32,
    dp: *mut f32,
    delta: *const f32,
) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512 is available and the buffer extents.
        Isa::Avx512 => unsafe { crate::x86::avx512::softmax_grad(sh, p, dp, delta) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX2 and FMA are available and the buffer extents.
        Isa::Avx2Fma => unsafe { crate::x86::avx2::softmax_grad(sh, p, dp, delta) },
        // SAFETY: the caller guarantees the buffer extents; no CPU features are needed.
        _ => unsafe { grad_portable(sh, p, dp, delta) },
    }
}

/// Flat C-ABI [`softmax_recompute`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `s`, `lse` (pointers to f32), then the `i64`s `rows`, `cols`, `ld`.
/// Returns 0 on success, or -1 without touching memory if a size is negative, `ld` is too
/// small, the extent overflows, or a pointer is null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`softmax_recompute_unchecked`] for the decoded
/// shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_softmax_recompute_f32(
    s: *mut f32,
    lse: *const f32,
    rows: i64,
    cols: i64,
    ld: i64,
) -> i32 {
    let Some((sh, n)) = ScoreTileShape::from_flat(rows, cols, ld) else { return -1 };
    if n > 0 && (s.is_null() || lse.is_null()) {
        return -1;
    }
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { softmax_recompute_unchecked(Isa::detect(), &sh, s, lse) };
    0
}

/// Flat C-ABI [`softmax_grad`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `p`, `dp`, `delta` (pointers to f32), then the `i64`s `rows`, `cols`,
/// `ld`. Returns 0 on success, or -1 without touching memory if a size is negative, `ld` is
/// too small, the extent overflows, or a pointer is null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`softmax_grad_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_softmax_grad_f32(
    p: *const f32,
    dp: *mut f32,
    delta: *const f32,
    rows: i64,
    cols: i64,
    ld: i64,
) -> i32 {
    let Some((sh, n)) = ScoreTileShape::from_flat(rows, cols, ld) else { return -1 };
    if n > 0 && (p.is_null() || dp.is_null() || delta.is_null()) {
        return -1;
    }
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { softmax_grad_unchecked(Isa::detect(), &sh, p, dp, delta) };
    0
}

/// The portable recompute, one float at a time.
///
/// # Safety
///
/// The contract of [`softmax_recompute_unchecked`], with `rows > 0` and `cols > 0`.
unsafe fn recompute_portable(sh: &ScoreTileShape, s: *mut f32, lse: *const f32) {
    let ScoreTileShape { rows, cols, ld } = *sh;
    for r in 0..rows {
        // SAFETY: row `r` of S spans `cols` floats at `r * ld`; `lse` holds `rows` floats.
        let (row, l) = unsafe { (std::slice::from_raw_parts_mut(s.add(r * ld), cols), *lse.add(r)) };
        if l == f32::NEG_INFINITY {
            row.fill(0.0);
        } else {
            for x in row {
                *x = exp2_scalar(*x - l);
            }
        }
    }
}

/// The portable gradient, one float at a time.
///
/// # Safety
///
/// The contract of [`softmax_grad_unchecked`], with `rows > 0` and `cols > 0`.
unsafe fn grad_portable(sh: &ScoreTileShape, p: *const f32, dp: *mut f32, delta: *const f32) {
    let ScoreTileShape { rows, cols, ld } = *sh;
    for r in 0..rows {
        // SAFETY: row `r` of each tile spans `cols` floats at `r * ld`, `dp` disjoint from `p`;
        // `delta` holds `rows` floats.
        let (prow, drow, dl) = unsafe {
            (
                std::slice::from_raw_parts(p.add(r * ld), cols),
                std::slice::from_raw_parts_mut(dp.add(r * ld), cols),
                *delta.add(r),
            )
        };
        for (g, &pv) in drow.iter_mut().zip(prow) {
            *g = if pv == 0.0 { 0.0 } else { pv * (*g - dl) };
        }
    }
}
