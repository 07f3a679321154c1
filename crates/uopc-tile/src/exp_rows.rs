//! The shifted exponential of a block of rows into another block: `Y = exp2(c (X - b))` with
//! one shift per row; see [`exp_rows`].
//!
//! It is the elementwise second pass of a softmax over rows whose maximum and normalizer a
//! first pass ([`crate::max_sum_exp`]) already found: X is read in place and never written, so
//! the input of a softmax or of a cross-entropy gradient stays intact.

use crate::error::{check_len, span};
use crate::softmax::exp2_scalar;
use crate::{Isa, TileError};

/// Shape of [`exp_rows`]: `rows x cols` blocks X (row stride `ldx`) and Y (row stride `ldy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExpRowsShape {
    /// Rows of X and Y (and shifts).
    pub rows: usize,
    /// Elements of each row.
    pub cols: usize,
    /// Row stride of X.
    pub ldx: usize,
    /// Row stride of Y.
    pub ldy: usize,
}

impl ExpRowsShape {
    /// The elements X and Y span (their minimum slice lengths).
    ///
    /// # Errors
    ///
    /// [`TileError::LeadingDim`] when `ldx` (operand `"x"`) or `ldy` (`"y"`) is below `cols`
    /// with two or more rows; [`TileError::Overflow`] when an extent does not fit in `usize`.
    pub fn extents(&self) -> Result<[usize; 2], TileError> {
        Ok([span("x", self.rows, self.cols, self.ldx)?, span("y", self.rows, self.cols, self.ldy)?])
    }
}

/// `Y[r, j] = exp2(c * (X[r, j] - shift[r]))` over a block of rows, with `c = scale`.
///
/// The exponent is formed as written, a subtraction and then the product (not `c X - c b`), so
/// it rounds as the same expression in a loop program does. X is only read. Special values
/// follow from the formula and IEEE arithmetic: an exponent at or below `-126.5` (and `-inf`)
/// gives 0, one of 128 or more (and `+inf`) gives `+inf`, a NaN operand (or `inf - inf`) gives NaN. `exp2` is the one
/// of [`crate::softmax_update`], with the same accuracy ([`crate::EXP2_MAX_REL_ERROR`]
/// relative).
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; the errors of [`ExpRowsShape::extents`]; [`TileError::BufferTooSmall`] if `x`, `y`
/// or `shift` (which needs `rows` elements) is too short.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{ExpRowsShape, Isa, TileError, exp_rows};
///
/// // softmax numerators of the row [1, 2, 3] shifted by its maximum, in base e.
/// let sh = ExpRowsShape { rows: 1, cols: 3, ldx: 3, ldy: 3 };
/// let mut y = [0.0f32; 3];
/// exp_rows(Isa::detect(), &sh, std::f32::consts::LOG2_E, &[1.0, 2.0, 3.0], &[3.0], &mut y)?;
/// assert!((y[0] as f64 - (-2f64).exp()).abs() < 1e-6 && y[2] == 1.0);
/// # Ok::<(), TileError>(())
/// ```
pub fn exp_rows(
    isa: Isa,
    sh: &ExpRowsShape,
    scale: f32,
    x: &[f32],
    shift: &[f32],
    y: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let [nx, ny] = sh.extents()?;
    check_len("x", nx, x.len())?;
    check_len("shift", if nx == 0 { 0 } else { sh.rows }, shift.len())?;
    check_len("y", ny, y.len())?;
    // SAFETY: the ISA is available, the slices cover their extents, and `y` is a unique borrow
    // (so it overlaps neither `x` nor `shift`).
    unsafe { exp_rows_unchecked(isa, sh, scale, x.as_ptr(), shift.as_ptr(), y.as_mut_ptr()) };
    Ok(())
}

/// [`exp_rows`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * `sh.extents()` is `Ok([nx, ny])`, `x` is valid for reads of `nx` f32s, `shift` for reads
///   of `sh.rows` (when `nx > 0`), `y` for writes of `ny`; all aligned for `f32` (null is fine
///   for an extent of 0).
/// * `y` overlaps neither `x` nor `shift`, and nothing else writes any of them during the call.
pub unsafe fn exp_rows_unchecked(
    isa: Isa,
    sh: &ExpRowsShape,
    scale: f32,
    x: *const f32,
    shift: *const f32,
    y: *mut f32,
) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    for r in 0..sh.rows {
        // SAFETY: row `r < rows` spans `cols` floats at `r * ldx` in X and `r * ldy` in Y,
        // inside their extents; `shift` holds `rows` floats.
        unsafe {
            let (xr, yr, b) = (x.add(r * sh.ldx), y.add(r * sh.ldy), *shift.add(r));
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX-512; the row is inside both extents.
                Isa::Avx512 => crate::x86::avx512::exp_row(xr, yr, sh.cols, b, scale),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX2 and FMA; the row is inside both extents.
                Isa::Avx2Fma => crate::x86::avx2::exp_row(xr, yr, sh.cols, b, scale),
                _ => {
                    for j in 0..sh.cols {
                        *yr.add(j) = exp2_scalar(scale * (*xr.add(j) - b));
                    }
                }
            }
        }
    }
}

/// Flat C-ABI [`exp_rows`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `x`, `shift`, `y` (pointers to f32), then the `i64`s `rows`, `cols`,
/// `ldx`, `ldy` and `scale` (the f32's bit pattern in the low 32 bits). Returns 0 on success,
/// or -1 without touching memory if a size is negative, a row stride is too small, an extent
/// overflows, or a pointer is null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`exp_rows_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_exp_rows_f32(
    x: *const f32,
    shift: *const f32,
    y: *mut f32,
    rows: i64,
    cols: i64,
    ldx: i64,
    ldy: i64,
    scale: i64,
) -> i32 {
    let u = |v: i64| usize::try_from(v).ok();
    let (Some(rows), Some(cols), Some(ldx), Some(ldy)) = (u(rows), u(cols), u(ldx), u(ldy)) else {
        return -1;
    };
    let sh = ExpRowsShape { rows, cols, ldx, ldy };
    let Ok([nx, _]) = sh.extents() else { return -1 };
    if nx > 0 && (x.is_null() || shift.is_null() || y.is_null()) {
        return -1;
    }
    // The low 32 bits are the f32's pattern; the truncation is the documented encoding.
    let scale = f32::from_bits(scale as u32);
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { exp_rows_unchecked(Isa::detect(), &sh, scale, x, shift, y) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp2(c (x - b))` in f64 from the f32 operands.
    fn reference(x: f32, b: f32, c: f32) -> f64 {
        (f64::from(c) * (f64::from(x) - f64::from(b))).exp2()
    }

    /// Checks every ISA of this CPU on `rows x cols` blocks with padded strides against f64:
    /// within the exp2's relative bound plus the f32 rounding of the exponent (its absolute
    /// error, at most half an ulp of `c (x - b)` and of `x - b`, scales the result by
    /// `2^err`, so `|exponent| * 2^-23` relative is allowed), and exact on special values.
    fn check(rows: usize, cols: usize, scale: f32, xs: &dyn Fn(usize, usize) -> f32, shifts: &[f32]) {
        let (ldx, ldy) = (cols + 3, cols + 5);
        let sh = ExpRowsShape { rows, cols, ldx, ldy };
        let [nx, ny] = sh.extents().unwrap();
        let mut x = vec![f32::NAN; nx];
        for r in 0..rows {
            for j in 0..cols {
                x[r * ldx + j] = xs(r, j);
            }
        }
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            // Sentinels in the row gaps must survive.
            let mut y = vec![-7.0f32; ny];
            exp_rows(isa, &sh, scale, &x, shifts, &mut y).unwrap();
            for r in 0..rows {
                for j in 0..cols {
                    let (got, want) = (y[r * ldy + j], reference(x[r * ldx + j], shifts[r], scale));
                    let e = f64::from(scale) * (f64::from(x[r * ldx + j]) - f64::from(shifts[r]));
                    let ok = if want.is_nan() {
                        got.is_nan()
                    } else if e <= -126.5 {
                        got == 0.0
                    } else if e >= 128.0 {
                        got == f32::INFINITY
                    } else {
                        let tol = 2.0 * crate::EXP2_MAX_REL_ERROR + (e.abs() + 1.0) * 2f64.powi(-23);
                        ((f64::from(got) - want) / want).abs() <= tol
                    };
                    assert!(
                        ok,
                        "{isa:?} {rows}x{cols} ({r}, {j}): x {} b {} got {got} want {want}",
                        x[r * ldx + j],
                        shifts[r]
                    );
                }
                for j in cols..ldy.min(ny - r * ldy) {
                    assert_eq!(y[r * ldy + j], -7.0, "{isa:?}: wrote the gap of row {r} at {j}");
                }
            }
        }
    }

    #[test]
    fn matches_f64_on_tails_strides_and_special_values() {
        let c = std::f32::consts::LOG2_E;
        for cols in [1, 15, 16, 17, 31, 33, 100] {
            let xs = |r: usize, j: usize| ((r * 37 + j * 11) % 97) as f32 * 0.37 - 18.0;
            check(3, cols, c, &xs, &[2.0, -1.5, 17.0]);
        }
        let inf = f32::INFINITY;
        let specials = [0.0, -inf, inf, f32::NAN, 300.0, -300.0, 1e-30, 88.0, 89.0, -87.0, -100.0];
        let xs = |_: usize, j: usize| specials[j % specials.len()];
        // finite, -inf (x - -inf = +inf), +inf (inf - inf NaN) and NaN shifts
        check(4, 40, c, &xs, &[1.0, -inf, inf, f32::NAN]);
        check(2, 40, 1.0, &xs, &[0.0, 50.0]);
    }

    #[test]
    fn bad_input_is_an_error_naming_the_operand() {
        let isa = Isa::Portable;
        let sh = ExpRowsShape { rows: 2, cols: 4, ldx: 3, ldy: 4 };
        let e = exp_rows(isa, &sh, 1.0, &[0.0; 8], &[0.0; 2], &mut [0.0; 8]).unwrap_err();
        assert!(matches!(e, TileError::LeadingDim { operand: "x", .. }), "{e:?}");
        let sh = ExpRowsShape { rows: 2, cols: 4, ldx: 4, ldy: 5 };
        let e = exp_rows(isa, &sh, 1.0, &[0.0; 8], &[0.0; 2], &mut [0.0; 8]).unwrap_err();
        assert_eq!(e, TileError::BufferTooSmall { operand: "y", needed: 9, len: 8 });
        let e = exp_rows(isa, &sh, 1.0, &[0.0; 8], &[0.0; 1], &mut [0.0; 9]).unwrap_err();
        assert_eq!(e, TileError::BufferTooSmall { operand: "shift", needed: 2, len: 1 });
        // SAFETY: a negative size is refused before any pointer is read.
        let status = unsafe {
            uopc_tile_exp_rows_f32(std::ptr::null(), std::ptr::null(), std::ptr::null_mut(), -1, 4, 4, 4, 0)
        };
        assert_eq!(status, -1);
    }
}
