//! The rows of the crate's `activate` and `activate_grad`, written once over the vector width
//! ([`F32Lanes`]) and once per function ([`Lanewise`]): 16 lanes on AVX-512 and 8 on AVX2, the
//! last vector of a row masked, each computing the portable kernels' formulas in the same
//! order with the softmax kernels' exponential.

use std::arch::x86_64::*;
use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

use super::register_tile::F32Lanes;
use super::row_sweep::{load, store};
use crate::activation_kind::{
    Activation, ERF_SATURATION, GELU_CUBIC, GELU_DENSITY, GELU_LOG2_TAIL, GELU_NEAR_ZERO,
    GELU_TWICE_SQRT_2_OVER_PI,
};

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

/// Exact GELU's `Phi(x)` and `exp2(-x^2/2 log2 e)` (`sqrt(2 pi)` times the normal density)
/// at `v`, in the order of the crate's portable `normal_cdf_terms`: `1/2 + s P(s^2)` near zero
/// (`s = x / sqrt 2`), else the lower tail `exp2(Q(u) - s^2 log2 e)` from `u = 12 / (2 + |s|) - 3`,
/// 0 past the saturation, or one minus it for `x >= 0`.
///
/// # Safety
///
/// `W`'s ISA is available.
#[inline(always)]
unsafe fn normal_cdf<W: F32Lanes>(v: W) -> (W, W) {
    // SAFETY: the ISA is available (this function's contract).
    unsafe {
        let horner = |c: &[f32], x: W| {
            c.iter().rev().skip(1).fold(W::splat(c[c.len() - 1]), |p, &k| W::mul_add(p, x, W::splat(k)))
        };
        let s = W::mul(v, W::splat(FRAC_1_SQRT_2));
        let m = W::minus_abs(s);
        let square = W::mul(s, s);
        let near = W::mul_add(horner(&GELU_NEAR_ZERO, square), s, W::splat(0.5));
        let u = W::add(W::div(W::splat(-12.0), W::add(m, W::splat(-2.0))), W::splat(-3.0));
        let exponent = W::mul_add(square, W::splat(-LOG2_E), horner(&GELU_LOG2_TAIL, u));
        // The fit's argument leaves [-1, 1] near zero, where `near` is taken instead.
        let tail = W::exp2_nonpositive(exponent);
        let tail = W::select_negative(W::add(m, W::splat(ERF_SATURATION as f32)), W::zero(), tail);
        let far = W::select_negative(v, tail, W::mul_add(tail, W::splat(-1.0), W::splat(1.0)));
        let cdf = W::select_negative(W::add(m, W::splat(1.0)), far, near);
        (cdf, W::exp2_nonpositive(W::mul(square, W::splat(-LOG2_E))))
    }
}

/// An activation's value and derivative over one vector, for the row loops.
trait Lanewise {
    /// `f(v)`.
    ///
    /// # Safety
    ///
    /// `W`'s ISA is available.
    unsafe fn value<W: F32Lanes>(v: W) -> W;

    /// `f'(v)`.
    ///
    /// # Safety
    ///
    /// `W`'s ISA is available.
    unsafe fn slope<W: F32Lanes>(v: W) -> W;
}

/// `x sigmoid(z(x))`: GELU's tanh form when `GELU`, else SiLU.
struct SigmoidGated<const GELU: bool>;

impl<const GELU: bool> Lanewise for SigmoidGated<GELU> {
    #[inline(always)]
    unsafe fn value<W: F32Lanes>(v: W) -> W {
        // SAFETY: the caller's contract.
        unsafe { W::mul(v, sigmoid(argument::<W, GELU>(v).0).0) }
    }

    /// `s + x s' z'`.
    #[inline(always)]
    unsafe fn slope<W: F32Lanes>(v: W) -> W {
        // SAFETY: the caller's contract.
        unsafe {
            let (z, dz) = argument::<W, GELU>(v);
            let (s, slope) = sigmoid(z);
            W::mul_add(W::mul(v, slope), dz, s)
        }
    }
}

/// `x Phi(x)`: exact GELU.
struct NormalGated;

impl Lanewise for NormalGated {
    #[inline(always)]
    unsafe fn value<W: F32Lanes>(v: W) -> W {
        // SAFETY: the caller's contract.
        unsafe { W::mul(v, normal_cdf(v).0) }
    }

    /// `Phi(x) + x phi(x)`.
    #[inline(always)]
    unsafe fn slope<W: F32Lanes>(v: W) -> W {
        // SAFETY: the caller's contract.
        unsafe {
            let (cdf, gauss) = normal_cdf(v);
            W::mul_add(W::mul(v, gauss), W::splat(GELU_DENSITY), cdf)
        }
    }
}

/// `x[j] = f(x[j])` for `j < len`.
///
/// # Safety
///
/// `W`'s ISA is available and `x` is readable and writable for `len` floats.
#[inline(always)]
unsafe fn value_row<W: F32Lanes, F: Lanewise>(x: *mut f32, len: usize) {
    for j in (0..len).step_by(W::LANES) {
        // SAFETY: each access covers `min(len - j, LANES)` floats from `j < len`.
        unsafe {
            let v = load::<W>(x.add(j), len - j);
            store(x.add(j), len - j, F::value(v));
        }
    }
}

/// `g[j] *= f'(x[j])` for `j < len`.
///
/// # Safety
///
/// `W`'s ISA is available, `x` is readable and `g` readable and writable for `len` floats.
#[inline(always)]
unsafe fn grad_row<W: F32Lanes, F: Lanewise>(x: *const f32, g: *mut f32, len: usize) {
    for j in (0..len).step_by(W::LANES) {
        // SAFETY: each access covers `min(len - j, LANES)` floats from `j < len`.
        unsafe {
            let d = F::slope(load::<W>(x.add(j), len - j));
            store(g.add(j), len - j, W::mul(load::<W>(g.add(j), len - j), d));
        }
    }
}

/// `x[j] = kind(x[j])` (`grad = None`) or `g[j] *= kind'(x[j])` (`grad = Some(g)`) for
/// `j < len`, over `W`.
///
/// # Safety
///
/// `W`'s ISA is available, `x` is readable (and writable without `grad`) and `g` readable and
/// writable for `len` floats.
#[inline(always)]
unsafe fn row<W: F32Lanes>(kind: Activation, x: *mut f32, grad: Option<*mut f32>, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        match (kind, grad) {
            (Activation::GeluTanh, None) => value_row::<W, SigmoidGated<true>>(x, len),
            (Activation::Silu, None) => value_row::<W, SigmoidGated<false>>(x, len),
            (Activation::Gelu, None) => value_row::<W, NormalGated>(x, len),
            (Activation::GeluTanh, Some(g)) => grad_row::<W, SigmoidGated<true>>(x, g, len),
            (Activation::Silu, Some(g)) => grad_row::<W, SigmoidGated<false>>(x, g, len),
            (Activation::Gelu, Some(g)) => grad_row::<W, NormalGated>(x, g, len),
        }
    }
}

/// `x[j] = kind(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `x` is readable and writable for `len` floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn row_avx512(kind: Activation, x: *mut f32, len: usize) {
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe { row::<__m512>(kind, x, None, len) }
}

/// `g[j] *= kind'(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available, `x` is readable and `g` readable and writable for `len`
/// floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn grad_row_avx512(kind: Activation, x: *const f32, g: *mut f32, len: usize) {
    // SAFETY: forwarded (the row is only read); the ISA is enabled here.
    unsafe { row::<__m512>(kind, x.cast_mut(), Some(g), len) }
}

/// `x[j] = kind(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX2 and FMA are available and `x` is readable and writable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn row_avx2(kind: Activation, x: *mut f32, len: usize) {
    // SAFETY: forwarded; the ISA is enabled here.
    unsafe { row::<__m256>(kind, x, None, len) }
}

/// `g[j] *= kind'(x[j])` for `j < len`.
///
/// # Safety
///
/// AVX2 and FMA are available, `x` is readable and `g` readable and writable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn grad_row_avx2(kind: Activation, x: *const f32, g: *mut f32, len: usize) {
    // SAFETY: forwarded (the row is only read); the ISA is enabled here.
    unsafe { row::<__m256>(kind, x.cast_mut(), Some(g), len) }
}
