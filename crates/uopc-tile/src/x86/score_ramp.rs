//! The vector rows of [`crate::score_ramp`]: `row[j] = fma(scale, row[j], fma(slope, j,
//! row_bias))`, eight lanes at a time on AVX2 and sixteen on AVX-512, the column index kept
//! as a float vector stepped by the width (exact below 2^24).

use std::arch::x86_64::*;

/// The AVX2 row, the tail masked.
///
/// # Safety
///
/// AVX2 and FMA are available and `row` is valid for reads and writes of `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn ramp_row_avx2(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    let (sv, cv, bv) = (_mm256_set1_ps(scale), _mm256_set1_ps(slope), _mm256_set1_ps(row_bias));
    let mut j = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
    let step = _mm256_set1_ps(8.0);
    let full = len - len % 8;
    // SAFETY: full vectors end at `full <= len`; the tail is masked to `len`.
    unsafe {
        for at in (0..full).step_by(8) {
            let x = _mm256_loadu_ps(row.add(at));
            _mm256_storeu_ps(row.add(at), _mm256_fmadd_ps(sv, x, _mm256_fmadd_ps(cv, j, bv)));
            j = _mm256_add_ps(j, step);
        }
        if !len.is_multiple_of(8) {
            let tail = super::avx2::lanes(len % 8);
            let x = _mm256_maskload_ps(row.add(full), tail);
            _mm256_maskstore_ps(row.add(full), tail, _mm256_fmadd_ps(sv, x, _mm256_fmadd_ps(cv, j, bv)));
        }
    }
}

/// The AVX-512 row, the tail masked.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `row` is valid for reads and writes of `len`
/// floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn ramp_row_avx512(row: *mut f32, len: usize, scale: f32, slope: f32, row_bias: f32) {
    let (sv, cv, bv) = (_mm512_set1_ps(scale), _mm512_set1_ps(slope), _mm512_set1_ps(row_bias));
    let mut j =
        _mm512_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0);
    let step = _mm512_set1_ps(16.0);
    let full = len - len % 16;
    // SAFETY: full vectors end at `full <= len`; the tail is masked to `len`.
    unsafe {
        for at in (0..full).step_by(16) {
            let x = _mm512_loadu_ps(row.add(at));
            _mm512_storeu_ps(row.add(at), _mm512_fmadd_ps(sv, x, _mm512_fmadd_ps(cv, j, bv)));
            j = _mm512_add_ps(j, step);
        }
        if !len.is_multiple_of(16) {
            let tail = super::avx512::lanes(len % 16);
            let x = _mm512_maskz_loadu_ps(tail, row.add(full));
            _mm512_mask_storeu_ps(row.add(full), tail, _mm512_fmadd_ps(sv, x, _mm512_fmadd_ps(cv, j, bv)));
        }
    }
}
