//! The vector rows of [`crate::score_ramp`]: `row[j] = fma(scale, row[j], fma(slope, j,
//! row_bias))`, written once over the vector width ([`F32Lanes`]) and instantiated at eight
//! lanes on AVX2 and sixteen on AVX-512, the column index kept as a float vector stepped by the
//! width (exact below 2^24).

use std::arch::x86_64::*;

use super::register_tile::F32Lanes;
use super::row_sweep::{load, store};

/// Column indices `0, 1, ..` of a vector's lanes, the first `LANES` of them.
static FIRST_COLUMNS: [f32; 16] =
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0];

/// One row at `W`'s width, the tail masked.
///
/// # Safety
///
/// `W`'s ISA is available and `row` is valid for reads and writes of `len` floats.
#[inline(always)]
unsafe fn ramp_row<W: F32Lanes>(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    // SAFETY: the ISA is the caller's; every load and store keeps to the `len - at` floats
    // left of the row (a short one is masked).
    unsafe {
        let (sv, cv, bv) = (W::splat(scale), W::splat(slope), W::splat(row_bias));
        let mut j = W::load(FIRST_COLUMNS.as_ptr());
        let step = W::splat(W::LANES as f32);
        for at in (0..len).step_by(W::LANES) {
            let x = load::<W>(row.add(at), len - at);
            store::<W>(row.add(at), len - at, W::mul_add(sv, x, W::mul_add(cv, j, bv)));
            j = W::add(j, step);
        }
    }
}

/// The AVX2 row.
///
/// # Safety
///
/// AVX2 and FMA are available and `row` is valid for reads and writes of `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn ramp_row_avx2(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    // SAFETY: this function's contract.
    unsafe { ramp_row::<__m256>(row, len, scale, slope, row_bias) }
}

/// The AVX-512 row.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `row` is valid for reads and writes of `len`
/// floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn ramp_row_avx512(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    // SAFETY: this function's contract.
    unsafe { ramp_row::<__m512>(row, len, scale, slope, row_bias) }
}
