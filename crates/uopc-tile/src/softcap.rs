//! Logit soft-capping of a score tile: `S = outer tanh(inner S)` in place; see [`softcap`].
//!
//! Gemma 2 and Grok cap attention scores as `c tanh(s / c)`. An attention kernel runs this on
//! its score tile between the score GEMM and the softmax step, where generated code would
//! evaluate the same formula four lanes at a time.

use crate::error::check_len;
use crate::shapes::SOFTCAP_TWO_LOG2_E;
use crate::softmax::exp2_scalar;
use crate::{Isa, ScoreTileShape, TileError};

/// `S[r, j] = outer * tanh(inner * S[r, j])` over a score tile of shape `sh`.
///
/// tanh is computed as `(1 - e) / (1 + e)` with `e = exp2(-2 log2(e) |inner s|)`, given the
/// sign of `inner s`: `e` is at most 1, so nothing overflows, `±inf` gives `±outer` and NaN
/// stays NaN. The absolute error of the tanh is within [`SOFTCAP_MAX_ABS_ERROR`] (the
/// exponential's relative error, [`crate::EXP2_MAX_REL_ERROR`], near `e = 1`, plus the
/// rounding of `inner s` and of the division), scaled by `|outer|`.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; the errors of [`ScoreTileShape::extent`]; [`TileError::BufferTooSmall`] if `s` is
/// shorter than the tile.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, ScoreTileShape, TileError, softcap};
///
/// // Scores capped at 30 (`30 tanh(s / 30)`).
/// let mut s = [0.0f32, 15.0, -300.0];
/// softcap(Isa::detect(), &ScoreTileShape::dense(1, 3), 1.0 / 30.0, 30.0, &mut s)?;
/// assert!(s[0] == 0.0 && (s[1] - 30.0 * 0.5f32.tanh()).abs() < 1e-4 && (s[2] + 30.0).abs() < 1e-4);
/// # Ok::<(), TileError>(())
/// ```
pub fn softcap(
    isa: Isa,
    sh: &ScoreTileShape,
    inner: f32,
    outer: f32,
    s: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("s", sh.extent()?, s.len())?;
    // SAFETY: the ISA is available and `s` covers the tile's extent, uniquely borrowed.
    unsafe { softcap_unchecked(isa, sh, inner, outer, s.as_mut_ptr()) };
    Ok(())
}

/// Bound on the absolute error of [`softcap`]'s tanh (before the product with `outer`),
/// asserted by this crate's tests against f64.
pub const SOFTCAP_MAX_ABS_ERROR: f64 = 4.0e-7;

/// [`softcap`] on a raw pointer, without checks.
///
/// # Safety
///
/// `isa.available()` is true; `s` is valid for reads and writes of the tile (row `r <
/// sh.rows` at `r * sh.ld`, `sh.cols` floats each), aligned for `f32`, and nothing else
/// accesses it during the call.
pub unsafe fn softcap_unchecked(isa: Isa, sh: &ScoreTileShape, inner: f32, outer: f32, s: *mut f32) {
    let row_op: unsafe fn(*mut f32, usize, f32, f32) = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => crate::x86::softcap::softcap_row_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => crate::x86::softcap::softcap_row,
        _ => softcap_row,
    };
    for r in 0..if sh.cols == 0 { 0 } else { sh.rows } {
        // SAFETY: row `r` spans `cols` floats at `r * ld`, inside the caller's tile; the ISA
        // the row function needs is available, as the caller guarantees.
        unsafe { row_op(s.add(r * sh.ld), sh.cols, inner, outer) };
    }
}

/// The portable row: the vector kernel's operations in the same order, one float at a time.
///
/// # Safety
///
/// `row` is valid for reads and writes of `len` floats.
unsafe fn softcap_row(row: *mut f32, len: usize, inner: f32, outer: f32) {
    const SIGN: u32 = 0x8000_0000;
    for j in 0..len {
        // SAFETY: `j < len`, inside the row.
        let x = unsafe { &mut *row.add(j) };
        let y = *x * inner;
        let e = exp2_scalar(f32::from_bits(y.to_bits() | SIGN) * SOFTCAP_TWO_LOG2_E);
        let t = (1.0 - e) / (1.0 + e);
        *x = f32::from_bits(t.to_bits() | (y.to_bits() & SIGN)) * outer;
    }
}

/// Flat C-ABI [`softcap`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `s` (a pointer to f32), then the `i64`s `rows`, `cols`, `ld`, `inner`
/// and `outer` (each f32's bit pattern in the low 32 bits). Returns 0 on success, or -1
/// without touching memory if a size is negative, the row stride is too small, the extent
/// overflows, or `s` is null while the tile is non-empty.
///
/// # Safety
///
/// `s` must satisfy the contract of [`softcap_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_softcap_f32(
    s: *mut f32,
    rows: i64,
    cols: i64,
    ld: i64,
    inner: i64,
    outer: i64,
) -> i32 {
    let Some((sh, n)) = ScoreTileShape::from_flat(rows, cols, ld) else { return -1 };
    if n > 0 && s.is_null() {
        return -1;
    }
    // The low 32 bits are each f32's pattern; the truncation is the documented encoding.
    let (inner, outer) = (f32::from_bits(inner as u32), f32::from_bits(outer as u32));
    // SAFETY: the detected ISA is available; the extent and pointer are the caller's contract.
    unsafe { softcap_unchecked(Isa::detect(), &sh, inner, outer, s) };
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
                softcap(isa, &ScoreTileShape { rows, cols, ld }, inner, outer, &mut x).unwrap();
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

    /// A dense sweep of the scores a soft-cap meets (through saturation, both signs) stays
    /// within the documented bound on every ISA of this CPU, each vector width's tail included.
    #[test]
    fn a_dense_sweep_stays_within_the_bound() {
        let x0: Vec<f32> = (0..40_003).map(|i| (i as f32 - 20_001.0) * 0.003).collect();
        for (inner, outer) in [(1.0 / 30.0, 30.0), (1.0, 1.0), (0.25, -4.0)] {
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let mut x = x0.clone();
                softcap(isa, &ScoreTileShape::dense(1, x.len()), inner, outer, &mut x).unwrap();
                for (&got, &was) in x.iter().zip(&x0) {
                    let want = f64::from(outer) * (f64::from(inner) * f64::from(was)).tanh();
                    let bound = f64::from(outer.abs()) * SOFTCAP_MAX_ABS_ERROR + want.abs() * 2f64.powi(-23);
                    assert!((f64::from(got) - want).abs() <= bound, "{isa:?}: {was} gave {got}, want {want}");
                }
            }
        }
    }

    #[test]
    fn bad_blocks_are_refused_before_writing() {
        let mut x = [1.0f32; 10];
        assert!(matches!(
            softcap(Isa::Portable, &ScoreTileShape { rows: 2, cols: 4, ld: 3 }, 1.0, 1.0, &mut x),
            Err(TileError::LeadingDim { .. })
        ));
        assert!(matches!(
            softcap(Isa::Portable, &ScoreTileShape::dense(3, 4), 1.0, 1.0, &mut x),
            Err(TileError::BufferTooSmall { operand: "s", .. })
        ));
        assert_eq!(x, [1.0; 10]);
        // SAFETY: a null pointer with a negative size is refused before any access.
        assert_eq!(unsafe { uopc_tile_softcap_f32(std::ptr::null_mut(), -1, 4, 4, 0, 0) }, -1);
    }
}
