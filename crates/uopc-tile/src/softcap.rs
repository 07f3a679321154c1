//! Logit soft-capping over a block of rows: `X = outer tanh(inner X)` in place; see
//! [`softcap`].
//!
//! Gemma 2 and Grok cap attention scores as `c tanh(s / c)`. An attention kernel runs this on
//! its score tile between the score GEMM and the softmax step, where generated code would
//! evaluate the same formula four lanes at a time.

use crate::error::{check_len, span};
use crate::softmax::exp2_scalar;
use crate::{Isa, TileError};

/// `2 log2(e)` as an f32, the factor of [`softcap`]'s exponent: `exp(-2|y|) = exp2(-|y| 2
/// log2(e))`.
pub const SOFTCAP_TWO_LOG2_E: f32 = 2.0 * std::f32::consts::LOG2_E;

/// `X[r, j] = outer * tanh(inner * X[r, j])` over a `rows x cols` block with row stride `ld`.
///
/// tanh is computed as `(1 - e) / (1 + e)` with `e = exp2(-2 log2(e) |inner x|)`, given the
/// sign of `inner x`: `e` is at most 1, so nothing overflows, `±inf` gives `±outer` and NaN
/// stays NaN. The absolute error of the tanh is within
/// [`SOFTCAP_MAX_ABS_ERROR`] (the exponential's relative error, [`crate::EXP2_MAX_REL_ERROR`],
/// near `e = 1`, plus the rounding of `inner x`, the division and the product), scaled by
/// `|outer|`.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; [`TileError::LeadingDim`] when `ld < cols` with two or more rows;
/// [`TileError::Overflow`] when the extent does not fit in `usize`;
/// [`TileError::BufferTooSmall`] if `x` is shorter than the block.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, TileError, softcap};
///
/// // Scores capped at 30 (`30 tanh(s / 30)`).
/// let mut x = [0.0f32, 15.0, -300.0];
/// softcap(Isa::detect(), 1, 3, 3, 1.0 / 30.0, 30.0, &mut x)?;
/// assert!(x[0] == 0.0 && (x[1] - 30.0 * 0.5f32.tanh()).abs() < 1e-4 && (x[2] + 30.0).abs() < 1e-4);
/// # Ok::<(), TileError>(())
/// ```
pub fn softcap(
    isa: Isa,
    rows: usize,
    cols: usize,
    ld: usize,
    inner: f32,
    outer: f32,
    x: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("x", span("x", rows, cols, ld)?, x.len())?;
    // SAFETY: the ISA is available and `x` covers the block's extent, uniquely borrowed.
    unsafe { softcap_unchecked(isa, rows, cols, ld, inner, outer, x.as_mut_ptr()) };
    Ok(())
}

/// Bound on the absolute error of [`softcap`]'s tanh (before the product with `outer`),
/// asserted by this crate's tests against f64.
pub const SOFTCAP_MAX_ABS_ERROR: f64 = 4.0e-7;

/// [`softcap`] on a raw pointer, without checks.
///
/// # Safety
///
/// `isa.available()` is true; `x` is valid for reads and writes of the block (row `r < rows`
/// at `r * ld`, `cols` floats each), aligned for `f32`, and nothing else accesses it during
/// the call.
pub unsafe fn softcap_unchecked(
    isa: Isa,
    rows: usize,
    cols: usize,
    ld: usize,
    inner: f32,
    outer: f32,
    x: *mut f32,
) {
    if cols == 0 {
        return;
    }
    for r in 0..rows {
        // SAFETY: row `r` spans `cols` floats at `r * ld`, inside the caller's block.
        unsafe {
            let row = x.add(r * ld);
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512 (which includes AVX2 and FMA) or AVX2 and FMA are available, as
                // the caller guarantees; the row is inside the block.
                Isa::Avx512 | Isa::Avx2Fma => crate::x86::softcap::softcap_row(row, cols, inner, outer),
                _ => {
                    for j in 0..cols {
                        *row.add(j) = softcap_scalar(*row.add(j), inner, outer);
                    }
                }
            }
        }
    }
}

/// One element of the portable path, the vector kernel's operations in the same order.
fn softcap_scalar(x: f32, inner: f32, outer: f32) -> f32 {
    const SIGN: u32 = 0x8000_0000;
    let y = x * inner;
    let negative = f32::from_bits(y.to_bits() | SIGN);
    let e = exp2_scalar(negative * SOFTCAP_TWO_LOG2_E);
    let t = (1.0 - e) / (1.0 + e);
    f32::from_bits(t.to_bits() | (y.to_bits() & SIGN)) * outer
}

/// Flat C-ABI [`softcap`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `x` (a pointer to f32), then the `i64`s `rows`, `cols`, `ld`, `inner`
/// and `outer` (each f32's bit pattern in the low 32 bits). Returns 0 on success, or -1
/// without touching memory if a size is negative, the row stride is too small, the extent
/// overflows, or `x` is null while the block is non-empty.
///
/// # Safety
///
/// `x` must satisfy the contract of [`softcap_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_softcap_f32(
    x: *mut f32,
    rows: i64,
    cols: i64,
    ld: i64,
    inner: i64,
    outer: i64,
) -> i32 {
    let u = |v: i64| usize::try_from(v).ok();
    let (Some(rows), Some(cols), Some(ld)) = (u(rows), u(cols), u(ld)) else { return -1 };
    let Ok(n) = span("x", rows, cols, ld) else { return -1 };
    if n > 0 && x.is_null() {
        return -1;
    }
    // The low 32 bits are each f32's pattern; the truncation is the documented encoding.
    let (inner, outer) = (f32::from_bits(inner as u32), f32::from_bits(outer as u32));
    // SAFETY: the detected ISA is available; the extent and pointer are the caller's contract.
    unsafe { softcap_unchecked(Isa::detect(), rows, cols, ld, inner, outer, x) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ISA of this CPU against f64 `outer tanh(inner x)` on a padded block: within the
    /// bound (scaled by `|outer|`, plus `outer`'s product's rounding), the row gaps untouched,
    /// and special values exact.
    #[test]
    fn every_isa_matches_f64_tanh() {
        let (rows, cols, ld) = (3, 37, 41);
        let mut x0 = vec![-9.0f32; (rows - 1) * ld + cols];
        let specials =
            [0.0, -0.0, 1e-30, -1e-6, 0.3, -2.5, 9.0, 40.0, -1e4, f32::INFINITY, f32::NEG_INFINITY];
        for r in 0..rows {
            for j in 0..cols {
                x0[r * ld + j] =
                    if j < specials.len() { specials[j] } else { (j as f32 - 18.0) * 0.37 * (r + 1) as f32 };
            }
        }
        x0[5] = f32::NAN;
        for (inner, outer) in [(1.0 / 30.0, 30.0), (0.02, -50.0), (1.0, 1.0)] {
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let mut x = x0.clone();
                softcap(isa, rows, cols, ld, inner, outer, &mut x).unwrap();
                for (i, (&got, &was)) in x.iter().zip(&x0).enumerate() {
                    if i % ld >= cols {
                        assert_eq!(got.to_bits(), was.to_bits(), "{isa:?}: gap {i} written");
                        continue;
                    }
                    let want = f64::from(outer) * (f64::from(inner) * f64::from(was)).tanh();
                    if want.is_nan() {
                        assert!(got.is_nan(), "{isa:?}: {was} gave {got}");
                        continue;
                    }
                    let bound = f64::from(outer.abs()) * SOFTCAP_MAX_ABS_ERROR + want.abs() * 2f64.powi(-23);
                    assert!((f64::from(got) - want).abs() <= bound, "{isa:?}: {was} gave {got}, want {want}");
                    // tanh is odd and saturates exactly.
                    if was.is_infinite() {
                        assert_eq!(f64::from(got), want, "{isa:?}: {was}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_blocks_are_refused_before_writing() {
        let mut x = [1.0f32; 10];
        assert!(matches!(
            softcap(Isa::Portable, 2, 4, 3, 1.0, 1.0, &mut x),
            Err(TileError::LeadingDim { .. })
        ));
        assert!(matches!(
            softcap(Isa::Portable, 3, 4, 4, 1.0, 1.0, &mut x),
            Err(TileError::BufferTooSmall { operand: "x", .. })
        ));
        assert_eq!(x, [1.0; 10]);
        // SAFETY: a null pointer with a negative size is refused before any access.
        assert_eq!(unsafe { uopc_tile_softcap_f32(std::ptr::null_mut(), -1, 4, 4, 0, 0) }, -1);
    }
}
