//! The rows of the crate's `activate` and `activate_grad`, written once over the vector width
//! ([`F32Lanes`]): 16 lanes on AVX-512 and 8 on AVX2, the last vector of a row masked, each
//! computing the portable kernels' formulas in the same order with the softmax kernels'
//! exponential.

use std::arch::x86_64::*;
use std::f32::consts::LOG2_E;

use super::register_tile::F32Lanes;
use super::row_sweep::{load, store};
use crate::activation_kind::{Activation, GELU_CUBIC, GELU_TWICE_SQRT_2_OVER_PI};

/// `z` and `dz/dx` at `v`: GELU's `2 sqrt(2/pi) (x + 0.044715 x^3)` (the cube's sum as one
/// multiply-add) when `GELU`, else SiLU's `x` (slope 1). A caller that needs only `z` leaves
/// the slope to dead-code elimination.
///
/// # Safety
///
/// `W`'s ISA is available.
#[inline(always)]
unsafe fn argument<W: F32Lanes, const GELU: bool>(v: W) -> (W, W) {
    // SAFETY: the ISA is available (this function's contract).
    unsafe {
        if !GELU {
            return (v, W::splat(1.0));
        }
        let square = W::mul(v, v);
        let inner = W::mul_add(W::mul(square, v), W::splat(GELU_CUBIC), v);
        let slope = W::mul_add(square, W::splat(3.0 * GELU_CUBIC), W::splat(1.0));
        let c = W::splat(GELU_TWICE_SQRT_2_OVER_PI);
        (W::mul(c, inner), W::mul(c, slope))
    }
}

/// `sigmoid(z)` and its slope `e / (1 + e)^2`, both from `e = exp2(-|z| log2 e)` and
/// `r = 1 / (1 + e)`: `s = z < 0 ? e r : r`, slope `e r r`.
///
/// # Safety
///
/// `W`'s ISA is available.
#[inline(always)]
unsafe fn sigmoid<W: F32Lanes>(z: W) -> (W, W) {
    // SAFETY: the ISA is available (this function's contract).
    unsafe {
        let one = W::splat(1.0);
        let e = W::exp2_nonpositive(W::mul(W::minus_abs(z), W::splat(LOG2_E)));
        let r = W::div(one, W::add(e, one));
        let er = W::mul(e, r);
        (W::select_negative(z, er, r), W::mul(er, r))
    }
}

/// `x[j] = x[j] sigmoid(z(x[j]))` for `j < len`.
///
/// # Safety
///
/// `W`'s ISA is available and `x` is readable and writable for `len` floats.
#[inline(always)]
unsafe fn value_row<W: F32Lanes, const GELU: bool>(x: *mut f32, len: usize) {
    for j in (0..len).step_by(W::LANES) {
        // SAFETY: each access covers `min(len - j, LANES)` floats from `j < len`.
        unsafe {
            let v = load::<W>(x.add(j), len - j);
            let (s, _) = sigmoid(argument::<W, GELU>(v).0);
            store(x.add(j), len - j, W::mul(v, s));
        }
    }
}

/// `g[j] *= s + x s' z'` at `x[j]` for `j < len` (the derivative of `x sigmoid(z(x))`).
///
/// # Safety
///
/// `W`'s ISA is available, `x` is readable and `g` readable and writable for `len` floats.
#[inline(always)]
unsafe fn grad_row<W: F32Lanes, const GELU: bool>(x: *const f32, g: *mut f32, len: usize) {
    for j in (0..len).step_by(W::LANES) {
        // SAFETY: each access covers `min(len - j, LANES)` floats from `j < len`.
        unsafe {
            let v = load::<W>(x.add(j), len - j);
            let (z, dz) = argument::<W, GELU>(v);
            let (s, slope) = sigmoid(z);
            let d = W::mul_add(W::mul(v, slope), dz, s);
            store(g.add(j), len - j, W::mul(load::<W>(g.add(j), len - j), d));
        }
    }
}

/// `x[j] = kind(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX-512F is available and `x` is readable and writable for `len` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn row_avx512(kind: Activation, x: *mut f32, len: usize) {
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe {
        match kind {
            Activation::GeluTanh => value_row::<__m512, true>(x, len),
            Activation::Silu => value_row::<__m512, false>(x, len),
        }
    }
}

/// `g[j] *= kind'(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX-512F is available, `x` is readable and `g` readable and writable for `len` floats.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn grad_row_avx512(kind: Activation, x: *const f32, g: *mut f32, len: usize) {
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe {
        match kind {
            Activation::GeluTanh => grad_row::<__m512, true>(x, g, len),
            Activation::Silu => grad_row::<__m512, false>(x, g, len),
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
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe {
        match kind {
            Activation::GeluTanh => value_row::<__m256, true>(x, len),
            Activation::Silu => value_row::<__m256, false>(x, len),
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
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe {
        match kind {
            Activation::GeluTanh => grad_row::<__m256, true>(x, g, len),
            Activation::Silu => grad_row::<__m256, false>(x, g, len),
        }
    }
}
