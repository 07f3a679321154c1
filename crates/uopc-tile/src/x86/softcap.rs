//! The vector rows of [`crate::softcap`]: `X = outer tanh(inner X)`, eight lanes at a time on
//! AVX2 and sixteen on AVX-512.
//!
//! The AVX-512 row takes `1 / (1 + e)` as `vrcp14ps` refined by one Newton step rather than
//! dividing: a 512-bit division issues no faster per lane than two 256-bit ones, so dividing
//! would leave the wider row no faster than the AVX2 one. The step's error (the square of
//! the estimate's 2^-14) is far below the bound [`crate::SOFTCAP_MAX_ABS_ERROR`] allows.

use std::arch::x86_64::*;

use super::avx2::lanes;
use super::exp2::{nonpositive_x8, nonpositive_x16};

/// `outer * tanh(inner * x)` per lane, as [`crate::softcap`] defines it: `e = exp2(-2 log2(e)
/// |inner x|)`, `t = (1 - e) / (1 + e)` with the sign of `inner x`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn softcap_x8(x: __m256, inner: __m256, outer: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let y = _mm256_mul_ps(x, inner);
    // `-|y|` (the sign bit set), then the exponent `-2 log2(e) |y|`, never positive.
    let negative = _mm256_or_ps(y, sign);
    let e = nonpositive_x8(_mm256_mul_ps(negative, _mm256_set1_ps(crate::shapes::SOFTCAP_TWO_LOG2_E)));
    let one = _mm256_set1_ps(1.0);
    let t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    // tanh is odd: `t >= 0` (or NaN) takes `y`'s sign.
    let t = _mm256_or_ps(t, _mm256_and_ps(y, sign));
    _mm256_mul_ps(t, outer)
}

/// `row[j] = outer * tanh(inner * row[j])` for `j < len`, the tail masked.
///
/// # Safety
///
/// AVX2 and FMA are available and `row` is valid for reads and writes of `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softcap_row(row: *mut f32, len: usize, inner: f32, outer: f32) {
    let (iv, ov) = (_mm256_set1_ps(inner), _mm256_set1_ps(outer));
    let full = len - len % 8;
    // SAFETY: full vectors end at `full <= len`; the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(8) {
            _mm256_storeu_ps(row.add(j), softcap_x8(_mm256_loadu_ps(row.add(j)), iv, ov));
        }
        if !len.is_multiple_of(8) {
            let tail = lanes(len % 8);
            let x = _mm256_maskload_ps(row.add(full), tail);
            _mm256_maskstore_ps(row.add(full), tail, softcap_x8(x, iv, ov));
        }
    }
}

/// [`softcap_x8`] on sixteen lanes, the quotient as a refined reciprocal (see the module docs).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
fn softcap_x16(x: __m512, inner: __m512, outer: __m512) -> __m512 {
    let sign = _mm512_set1_ps(-0.0);
    let y = _mm512_mul_ps(x, inner);
    let negative = _mm512_or_ps(y, sign);
    let e = nonpositive_x16(_mm512_mul_ps(negative, _mm512_set1_ps(crate::shapes::SOFTCAP_TWO_LOG2_E)));
    let one = _mm512_set1_ps(1.0);
    // `e` lies in [0, 1], so `1 + e` in [1, 2]: the estimate is never of a zero or an infinity.
    let denominator = _mm512_add_ps(one, e);
    let estimate = _mm512_rcp14_ps(denominator);
    // One Newton step: r' = r (2 - d r), written r + r (1 - d r).
    let residual = _mm512_fnmadd_ps(denominator, estimate, one);
    let reciprocal = _mm512_fmadd_ps(estimate, residual, estimate);
    let t = _mm512_mul_ps(_mm512_sub_ps(one, e), reciprocal);
    let t = _mm512_or_ps(t, _mm512_and_ps(y, sign));
    _mm512_mul_ps(t, outer)
}

/// [`softcap_row`] sixteen lanes at a time, the tail masked.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `row` is valid for reads and writes of `len`
/// floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn softcap_row_avx512(row: *mut f32, len: usize, inner: f32, outer: f32) {
    let (iv, ov) = (_mm512_set1_ps(inner), _mm512_set1_ps(outer));
    let full = len - len % 16;
    // SAFETY: full vectors end at `full <= len`; the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(16) {
            _mm512_storeu_ps(row.add(j), softcap_x16(_mm512_loadu_ps(row.add(j)), iv, ov));
        }
        if !len.is_multiple_of(16) {
            let tail = super::avx512::lanes(len % 16);
            let x = _mm512_maskz_loadu_ps(tail, row.add(full));
            _mm512_mask_storeu_ps(row.add(full), tail, softcap_x16(x, iv, ov));
        }
    }
}
