//! The activations of the crate's `activate` over one row: 16 lanes at a time on AVX-512 (the
//! tail masked), 8 on AVX2 (the tail through a padded copy), both computing the portable
//! kernel's formula in the same order with the softmax kernels' exponential.

use std::arch::x86_64::*;
use std::f32::consts::LOG2_E;

use crate::activation_kind::{Activation, GELU_CUBIC, GELU_TWICE_SQRT_2_OVER_PI};

/// `x[j] = kind(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX-512F is available and `x` is readable and writable for `len` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn row_avx512(kind: Activation, x: *mut f32, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        match kind {
            Activation::GeluTanh => row16(x, len, |v| {
                let cube = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
                let inner = _mm512_fmadd_ps(cube, _mm512_set1_ps(GELU_CUBIC), v);
                _mm512_mul_ps(_mm512_set1_ps(GELU_TWICE_SQRT_2_OVER_PI), inner)
            }),
            Activation::Silu => row16(x, len, |v| v),
        }
    }
}

/// `x sigmoid(z_of(x))` over the row, the sigmoid through `exp2(-|z| log2 e)`.
///
/// # Safety
///
/// As [`row_avx512`].
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn row16(x: *mut f32, len: usize, z_of: impl Fn(__m512) -> __m512) {
    let one = _mm512_set1_ps(1.0);
    let f = |v: __m512| {
        let z = z_of(v);
        // -|z|: the sign bit set (a NaN stays NaN).
        let neg_abs =
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(z), _mm512_set1_epi32(i32::MIN)));
        let e = super::avx512::exp2_nonpositive(_mm512_mul_ps(neg_abs, _mm512_set1_ps(LOG2_E)));
        let r = _mm512_div_ps(one, _mm512_add_ps(e, one));
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps());
        _mm512_mul_ps(v, _mm512_mask_mul_ps(r, below, e, r))
    };
    let full = len - len % 16;
    // SAFETY: full vectors end at `full <= len`, the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(16) {
            _mm512_storeu_ps(x.add(j), f(_mm512_loadu_ps(x.add(j))));
        }
        let tail = super::avx512::lanes(len % 16);
        if tail != 0 {
            _mm512_mask_storeu_ps(x.add(full), tail, f(_mm512_maskz_loadu_ps(tail, x.add(full))));
        }
    }
}

/// `x[j] = kind(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX2 and FMA are available and `x` is readable and writable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn row_avx2(kind: Activation, x: *mut f32, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        match kind {
            Activation::GeluTanh => row8(x, len, |v| {
                let cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
                let inner = _mm256_fmadd_ps(cube, _mm256_set1_ps(GELU_CUBIC), v);
                _mm256_mul_ps(_mm256_set1_ps(GELU_TWICE_SQRT_2_OVER_PI), inner)
            }),
            Activation::Silu => row8(x, len, |v| v),
        }
    }
}

/// [`row16`] at 8 lanes.
///
/// # Safety
///
/// As [`row_avx2`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row8(x: *mut f32, len: usize, z_of: impl Fn(__m256) -> __m256) {
    let one = _mm256_set1_ps(1.0);
    let f = |v: __m256| {
        let z = z_of(v);
        let neg_abs = _mm256_or_ps(z, _mm256_set1_ps(-0.0));
        let e = super::avx2::exp2_nonpositive(_mm256_mul_ps(neg_abs, _mm256_set1_ps(LOG2_E)));
        let r = _mm256_div_ps(one, _mm256_add_ps(e, one));
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(z, _mm256_setzero_ps());
        _mm256_mul_ps(v, _mm256_blendv_ps(r, _mm256_mul_ps(e, r), below))
    };
    let full = len - len % 8;
    // SAFETY: full vectors end at `full <= len`; the tail goes through a local copy.
    unsafe {
        for j in (0..full).step_by(8) {
            _mm256_storeu_ps(x.add(j), f(_mm256_loadu_ps(x.add(j))));
        }
        let rest = len - full;
        if rest != 0 {
            let mut pad = [0.0f32; 8];
            std::ptr::copy_nonoverlapping(x.add(full), pad.as_mut_ptr(), rest);
            _mm256_storeu_ps(pad.as_mut_ptr(), f(_mm256_loadu_ps(pad.as_ptr())));
            std::ptr::copy_nonoverlapping(pad.as_ptr(), x.add(full), rest);
        }
    }
}

/// `g[j] *= kind'(x[j])` for `j < len` (see the crate's `activate_grad`).
///
/// # Safety
///
/// AVX-512F is available, `x` is readable and `g` readable and writable for `len` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn grad_row_avx512(kind: Activation, x: *const f32, g: *mut f32, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        match kind {
            Activation::GeluTanh => grad_row16(x, g, len, |v| {
                let square = _mm512_mul_ps(v, v);
                let inner = _mm512_fmadd_ps(_mm512_mul_ps(square, v), _mm512_set1_ps(GELU_CUBIC), v);
                let slope = _mm512_fmadd_ps(square, _mm512_set1_ps(3.0 * GELU_CUBIC), _mm512_set1_ps(1.0));
                let c = _mm512_set1_ps(GELU_TWICE_SQRT_2_OVER_PI);
                (_mm512_mul_ps(c, inner), _mm512_mul_ps(c, slope))
            }),
            Activation::Silu => grad_row16(x, g, len, |v| (v, _mm512_set1_ps(1.0))),
        }
    }
}

/// `g *= s + x s' dz` over the row with `(z, dz) = z_of(x)`, `s = sigmoid(z)` and
/// `s' = e / (1 + e)^2` from the same `e = exp2(-|z| log2 e)`.
///
/// # Safety
///
/// As [`grad_row_avx512`].
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn grad_row16(x: *const f32, g: *mut f32, len: usize, z_of: impl Fn(__m512) -> (__m512, __m512)) {
    let one = _mm512_set1_ps(1.0);
    let f = |v: __m512, gv: __m512| {
        let (z, dz) = z_of(v);
        let neg_abs =
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(z), _mm512_set1_epi32(i32::MIN)));
        let e = super::avx512::exp2_nonpositive(_mm512_mul_ps(neg_abs, _mm512_set1_ps(LOG2_E)));
        let r = _mm512_div_ps(one, _mm512_add_ps(e, one));
        let er = _mm512_mul_ps(e, r);
        let s = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps()), r, er);
        let slope = _mm512_mul_ps(er, r);
        _mm512_mul_ps(gv, _mm512_fmadd_ps(_mm512_mul_ps(v, slope), dz, s))
    };
    let full = len - len % 16;
    // SAFETY: full vectors end at `full <= len`, the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(16) {
            _mm512_storeu_ps(g.add(j), f(_mm512_loadu_ps(x.add(j)), _mm512_loadu_ps(g.add(j))));
        }
        let tail = super::avx512::lanes(len % 16);
        if tail != 0 {
            let (v, gv) =
                (_mm512_maskz_loadu_ps(tail, x.add(full)), _mm512_maskz_loadu_ps(tail, g.add(full)));
            _mm512_mask_storeu_ps(g.add(full), tail, f(v, gv));
        }
    }
}

/// `g[j] *= kind'(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX2 and FMA are available, `x` is readable and `g` readable and writable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn grad_row_avx2(kind: Activation, x: *const f32, g: *mut f32, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        match kind {
            Activation::GeluTanh => grad_row8(x, g, len, |v| {
                let square = _mm256_mul_ps(v, v);
                let inner = _mm256_fmadd_ps(_mm256_mul_ps(square, v), _mm256_set1_ps(GELU_CUBIC), v);
                let slope = _mm256_fmadd_ps(square, _mm256_set1_ps(3.0 * GELU_CUBIC), _mm256_set1_ps(1.0));
                let c = _mm256_set1_ps(GELU_TWICE_SQRT_2_OVER_PI);
                (_mm256_mul_ps(c, inner), _mm256_mul_ps(c, slope))
            }),
            Activation::Silu => grad_row8(x, g, len, |v| (v, _mm256_set1_ps(1.0))),
        }
    }
}

/// [`grad_row16`] at 8 lanes.
///
/// # Safety
///
/// As [`grad_row_avx2`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn grad_row8(x: *const f32, g: *mut f32, len: usize, z_of: impl Fn(__m256) -> (__m256, __m256)) {
    let one = _mm256_set1_ps(1.0);
    let f = |v: __m256, gv: __m256| {
        let (z, dz) = z_of(v);
        let neg_abs = _mm256_or_ps(z, _mm256_set1_ps(-0.0));
        let e = super::avx2::exp2_nonpositive(_mm256_mul_ps(neg_abs, _mm256_set1_ps(LOG2_E)));
        let r = _mm256_div_ps(one, _mm256_add_ps(e, one));
        let er = _mm256_mul_ps(e, r);
        let s = _mm256_blendv_ps(r, er, _mm256_cmp_ps::<_CMP_LT_OQ>(z, _mm256_setzero_ps()));
        let slope = _mm256_mul_ps(er, r);
        _mm256_mul_ps(gv, _mm256_fmadd_ps(_mm256_mul_ps(v, slope), dz, s))
    };
    let full = len - len % 8;
    // SAFETY: full vectors end at `full <= len`; the tail goes through local copies.
    unsafe {
        for j in (0..full).step_by(8) {
            _mm256_storeu_ps(g.add(j), f(_mm256_loadu_ps(x.add(j)), _mm256_loadu_ps(g.add(j))));
        }
        let rest = len - full;
        if rest != 0 {
            let (mut px, mut pg) = ([0.0f32; 8], [0.0f32; 8]);
            std::ptr::copy_nonoverlapping(x.add(full), px.as_mut_ptr(), rest);
            std::ptr::copy_nonoverlapping(g.add(full), pg.as_mut_ptr(), rest);
            _mm256_storeu_ps(pg.as_mut_ptr(), f(_mm256_loadu_ps(px.as_ptr()), _mm256_loadu_ps(pg.as_ptr())));
            std::ptr::copy_nonoverlapping(pg.as_ptr(), g.add(full), rest);
        }
    }
}
