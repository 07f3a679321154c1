//! The AVX2 row of [`crate::softcap`]: `X = outer tanh(inner X)`, eight lanes at a time. CPUs
//! with AVX-512 run it too (they have AVX2 and FMA): the op is a small share of an attention
//! block, and one body keeps the rounding the same on both.

use std::arch::x86_64::*;

use super::avx2::lanes;
use super::exp2::nonpositive_x8;

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
