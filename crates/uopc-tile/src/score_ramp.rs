//! A score tile's scale and a bias linear in the key's and the query's positions, in place:
//! `S = scale S + slope (origin + j - r)`; see [`score_ramp`].
//!
//! ALiBi (BLOOM, MPT) adds `slope_h (k - q)` to each score of head `h`. An attention kernel
//! runs this on its score tile right after the score GEMM (`origin` the tile's first key less
//! its first query), where generated code would add the bias four lanes at a time.

use crate::error::check_len;
use crate::{Isa, ScoreTileShape, TileError};

/// `S[r, j] = scale * S[r, j] + slope * (origin + j - r)` over a score tile of shape `sh`.
///
/// Computed in f32 as `fma(scale, s, fma(c, j, c * (origin - r)))` with `c = slope`: the
/// bias of row `r` at column 0 rounded once, then each column's bias and the scaled score one
/// rounding each, the same on every ISA (the portable path uses `f32::mul_add`). `origin - r`
/// and `j` are exact for tiles and positions below 2^24.
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
/// use uopc_tile::{Isa, ScoreTileShape, TileError, score_ramp};
///
/// // Two query rows (queries 5 and 6) against keys 3 and 4, slope -0.5: `s - 0.5 (k - q)`.
/// let mut s = [1.0f32, 1.0, 1.0, 1.0];
/// score_ramp(Isa::detect(), &ScoreTileShape::dense(2, 2), 1.0, -0.5, 3.0 - 5.0, &mut s)?;
/// assert_eq!(s, [2.0, 1.5, 2.5, 2.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn score_ramp(
    isa: Isa,
    sh: &ScoreTileShape,
    scale: f32,
    slope: f32,
    origin: f32,
    s: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("s", sh.extent()?, s.len())?;
    // SAFETY: the ISA is available and `s` covers the tile's extent, uniquely borrowed.
    unsafe { score_ramp_unchecked(isa, sh, scale, slope, origin, s.as_mut_ptr()) };
    Ok(())
}

/// [`score_ramp`] on a raw pointer, without checks.
///
/// # Safety
///
/// `isa.available()` is true; `s` is valid for reads and writes of the tile (row `r <
/// sh.rows` at `r * sh.ld`, `sh.cols` floats each), aligned for `f32`, and nothing else
/// accesses it during the call.
pub unsafe fn score_ramp_unchecked(
    isa: Isa,
    sh: &ScoreTileShape,
    scale: f32,
    slope: f32,
    origin: f32,
    s: *mut f32,
) {
    let row_op: unsafe fn(*mut f32, usize, f32, f32, f32) = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => crate::x86::score_ramp::ramp_row_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => crate::x86::score_ramp::ramp_row_avx2,
        _ => ramp_row,
    };
    for r in 0..if sh.cols == 0 { 0 } else { sh.rows } {
        let row_bias = slope * (origin - r as f32);
        // SAFETY: row `r` spans `cols` floats at `r * ld`, inside the caller's tile; the ISA
        // the row function needs is available, as the caller guarantees.
        unsafe { row_op(s.add(r * sh.ld), sh.cols, scale, slope, row_bias) };
    }
}

/// The portable row: `row[j] = fma(scale, row[j], fma(slope, j, row_bias))`.
///
/// # Safety
///
/// `row` is valid for reads and writes of `len` floats.
unsafe fn ramp_row(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    for j in 0..len {
        // SAFETY: `j < len`, inside the row.
        let x = unsafe { &mut *row.add(j) };
        *x = scale.mul_add(*x, slope.mul_add(j as f32, row_bias));
    }
}

/// Flat C-ABI [`score_ramp`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `s`, `slope` and `origin` (pointers to f32; the latter two hold one
/// value each), then the `i64`s `rows`, `cols`, `ld`, `scale` and `slope_scale` (each f32's
/// bit pattern in the low 32 bits; the slope applied is `slope_scale * *slope`). Returns 0 on
/// success, or -1 without touching memory if a size is negative, the row stride is too small,
/// the extent overflows, or a pointer is null while the tile is non-empty.
///
/// # Safety
///
/// `s` must satisfy the contract of [`score_ramp_unchecked`] for the decoded shape, and
/// `slope` and `origin` be readable when the tile is non-empty.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_score_ramp_f32(
    s: *mut f32,
    slope: *const f32,
    origin: *const f32,
    rows: i64,
    cols: i64,
    ld: i64,
    scale: i64,
    slope_scale: i64,
) -> i32 {
    let Some((sh, n)) = ScoreTileShape::from_flat(rows, cols, ld) else { return -1 };
    if n == 0 {
        return 0;
    }
    if s.is_null() || slope.is_null() || origin.is_null() {
        return -1;
    }
    // The low 32 bits are each f32's pattern; the truncation is the documented encoding.
    let (scale, slope_scale) = (f32::from_bits(scale as u32), f32::from_bits(slope_scale as u32));
    // SAFETY: both scalars are readable (the caller's contract, checked non-null above).
    let (slope, origin) = unsafe { (slope_scale * *slope, *origin) };
    // SAFETY: the detected ISA is available; the extent and pointer are the caller's contract.
    unsafe { score_ramp_unchecked(Isa::detect(), &sh, scale, slope, origin, s) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ISA of this CPU gives the portable path's bits (one rounding order everywhere),
    /// within two roundings of f64, with the row gaps untouched.
    #[test]
    fn every_isa_matches_f64_and_the_portable_bits() {
        let (rows, cols, ld) = (5, 37, 41);
        let x0: Vec<f32> = (0..(rows - 1) * ld + cols).map(|i| ((i * 7) % 23) as f32 * 0.37 - 4.0).collect();
        for (scale, slope, origin) in [(1.0f32, -0.5f32, -3.0f32), (0.125, 0.0039, 1000.0), (-2.0, 3.0, 0.0)]
        {
            let mut want = x0.clone();
            score_ramp(Isa::Portable, &ScoreTileShape { rows, cols, ld }, scale, slope, origin, &mut want)
                .unwrap();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let mut x = x0.clone();
                score_ramp(isa, &ScoreTileShape { rows, cols, ld }, scale, slope, origin, &mut x).unwrap();
                for (i, ((&got, &was), &portable)) in x.iter().zip(&x0).zip(&want).enumerate() {
                    let (r, j) = (i / ld, i % ld);
                    if j >= cols {
                        assert_eq!(got.to_bits(), was.to_bits(), "{isa:?}: gap {i} written");
                        continue;
                    }
                    assert_eq!(got.to_bits(), portable.to_bits(), "{isa:?}: element {i}");
                    let exact = f64::from(scale) * f64::from(was)
                        + f64::from(slope) * (f64::from(origin) + j as f64 - r as f64);
                    let bias = (f64::from(slope) * (f64::from(origin) - r as f64)).abs()
                        + (f64::from(slope) * j as f64).abs();
                    let bound = (exact.abs() + 2.0 * bias) * 2f64.powi(-23);
                    assert!((f64::from(got) - exact).abs() <= bound, "{isa:?}: {i}: {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn the_c_entry_refuses_bad_shapes_and_null_scalars() {
        let mut s = [1.0f32; 4];
        let (slope, origin) = (2.0f32, 0.0f32);
        let one = 1.0f32.to_bits() as i64;
        // SAFETY: the pointers cover what each call may read and write.
        unsafe {
            assert_eq!(uopc_tile_score_ramp_f32(s.as_mut_ptr(), &slope, &origin, 2, 2, 1, one, one), -1);
            assert_eq!(
                uopc_tile_score_ramp_f32(s.as_mut_ptr(), std::ptr::null(), &origin, 2, 2, 2, one, one),
                -1
            );
            assert_eq!(s, [1.0; 4]);
            assert_eq!(uopc_tile_score_ramp_f32(s.as_mut_ptr(), &slope, &origin, 2, 2, 2, one, one), 0);
        }
        // Row 0: 1 + 2 (0 + j); row 1: 1 + 2 (j - 1).
        assert_eq!(s, [1.0, 3.0, -1.0, 1.0]);
    }

    #[test]
    fn bad_blocks_are_refused_before_writing() {
        let mut x = [1.0f32; 10];
        assert!(
            score_ramp(Isa::Portable, &ScoreTileShape { rows: 2, cols: 4, ld: 3 }, 1.0, 1.0, 0.0, &mut x)
                .is_err()
        );
        assert!(score_ramp(Isa::Portable, &ScoreTileShape::dense(3, 4), 1.0, 1.0, 0.0, &mut x).is_err());
        assert_eq!(x, [1.0; 10]);
    }
}
