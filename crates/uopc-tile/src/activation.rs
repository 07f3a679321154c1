//! Activation functions applied in place over a block of rows ([`activate`]): GELU's tanh
//! form (GPT-2's MLP), SiLU (Llama's) and exact GELU (BERT's), the elementwise tail of a
//! linear layer.
//!
//! The first two are `x * sigmoid(z)` for a `z` formed from `x`, with the sigmoid taken
//! through one exponential of `-|z|` (no overflow, exact tails); exact GELU is `x * Phi(x)`
//! through the fits of the tensor graph's f32 `erf`, its lower tail `erfc / 2` computed
//! directly (no `1 - erf` cancellation). The same formulas the tensor graph's `gelu_tanh`,
//! `silu` and `gelu` build, here 16 (AVX-512) or 8 (AVX2) elements per instruction where
//! generated code, limited to 128-bit vectors and 16 registers, takes four.

pub use crate::activation_kind::{
    Activation, ERF_LOG_ERFC_FIT, ERF_NEAR_ZERO_FIT, ERF_POLYNOMIAL_BOUND, ERF_SATURATION, GELU_CUBIC,
    GELU_DENSITY, GELU_LOG2_TAIL, GELU_NEAR_ZERO, GELU_TWICE_SQRT_2_OVER_PI,
};
use crate::error::{check_len, span};
use crate::softmax::exp2_scalar;
use crate::{Isa, TileError};

/// `X = f(X)` in place over a `rows x cols` block with row stride `ld`, `f` being `kind`.
///
/// Accuracy: the sigmoid's exponential is the one of [`crate::softmax_update`]
/// ([`crate::EXP2_MAX_REL_ERROR`] relative), its reciprocal an exact division; `z` is formed
/// in f32 (GELU's cube and sum rounded as written, the sum fused into one multiply-add), so
/// the result is within a few ulps of the function of the f32 `x`, times `1 + |z| 2^-23`
/// where the sigmoid's tail magnifies the rounding of `z`. Exact GELU adds the fits' error
/// (below `1e-7` relative in `Phi`), its lower tail magnified by `1 + x^2 2^-23` likewise, and
/// is exactly `x` or `-0` from `|x| = 4 sqrt 2` on, where the f32 `erf` saturates. Special
/// values follow the formula: NaN stays NaN, `+inf` gives `+inf`, `-inf` gives NaN
/// (`-inf * 0`, as torch's tanh form does), a large negative `x` gives `-0`. Row gaps past
/// `cols` are not touched.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; [`TileError::LeadingDim`] when `ld < cols` with two or more rows;
/// [`TileError::BufferTooSmall`] if `x` is shorter than the block.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Activation, Isa, TileError, activate};
///
/// let mut x = [1.0f32, -1.0, 0.0, 3.0];
/// activate(Isa::detect(), Activation::GeluTanh, 2, 2, 2, &mut x)?;
/// assert!((x[0] - 0.841_192).abs() < 1e-6 && (x[1] + 0.158_808).abs() < 1e-6);
/// assert_eq!(x[2], 0.0);
/// # Ok::<(), TileError>(())
/// ```
pub fn activate(
    isa: Isa,
    kind: Activation,
    rows: usize,
    cols: usize,
    ld: usize,
    x: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("x", span("x", rows, cols, ld)?, x.len())?;
    // SAFETY: the ISA is available and `x` covers the block's extent, uniquely borrowed.
    unsafe { activate_unchecked(isa, kind, rows, cols, ld, x.as_mut_ptr()) };
    Ok(())
}

/// [`activate`] on a raw pointer, without checks.
///
/// # Safety
///
/// `isa.available()` is true; `x` is valid for reads and writes of the block (row `r < rows`
/// at `r * ld`, `cols` floats each), aligned for `f32`, and nothing else accesses it during
/// the call.
pub unsafe fn activate_unchecked(
    isa: Isa,
    kind: Activation,
    rows: usize,
    cols: usize,
    ld: usize,
    x: *mut f32,
) {
    if cols == 0 {
        return;
    }
    for r in 0..rows {
        // SAFETY: row `r` spans `cols` floats at `r * ld`, inside the caller's block.
        unsafe {
            let row = x.add(r * ld);
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX-512.
                Isa::Avx512 => crate::x86::activation::row_avx512(kind, row, cols),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX2 and FMA.
                Isa::Avx2Fma => crate::x86::activation::row_avx2(kind, row, cols),
                _ => {
                    for v in std::slice::from_raw_parts_mut(row, cols) {
                        *v = apply(kind, *v);
                    }
                }
            }
        }
    }
}

/// Flat C-ABI [`activate`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `x` (a pointer to f32), then the `i64`s `rows`, `cols`, `ld` and the
/// activation's [`Activation::code`]. Returns 0 on success, or -1 without touching memory if
/// a size is negative, `ld` is too small, the extent overflows, the code is unknown, or the
/// pointer is null while the block is non-empty.
///
/// # Safety
///
/// The pointer must satisfy the contract of [`activate_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_activation_f32(
    x: *mut f32,
    rows: i64,
    cols: i64,
    ld: i64,
    kind: i64,
) -> i32 {
    let u = |v: i64| usize::try_from(v).ok();
    let (Some(rows), Some(cols), Some(ld), Some(kind)) =
        (u(rows), u(cols), u(ld), Activation::from_code(kind))
    else {
        return -1;
    };
    let Ok(n) = span("x", rows, cols, ld) else { return -1 };
    if n > 0 && x.is_null() {
        return -1;
    }
    // SAFETY: the detected ISA is available; the extent and pointer are the caller's contract.
    unsafe { activate_unchecked(Isa::detect(), kind, rows, cols, ld, x) };
    0
}

/// `kind` on one f32, as the vector kernels compute it (the portable kernel).
fn apply(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Gelu => x * normal_cdf_terms(x).0,
        _ => x * sigmoid_terms(kind == Activation::GeluTanh, x).0,
    }
}

/// Exact GELU's `(Phi(x), exp2(-s^2 log2 e))` at one f32 `x`, `s = x / sqrt 2` (the second is
/// `sqrt(2 pi)` times the normal density), as the vector kernels compute them: with
/// `m = -|s|`, `1/2 + s P(s^2)` while `m + 1 >= 0`, else the lower tail
/// `exp2(Q(u) - s^2 log2 e)` (`u = -12 / (m - 2) - 3`, 0 once `m + 4 < 0`), or one minus it
/// for `x >= 0`; polynomials by Horner's rule in multiply-adds ([`GELU_NEAR_ZERO`],
/// [`GELU_LOG2_TAIL`]).
pub(crate) fn normal_cdf_terms(x: f32) -> (f32, f32) {
    let horner = |c: &[f32], v: f32| c.iter().rev().skip(1).fold(c[c.len() - 1], |p, &k| p.mul_add(v, k));
    let s = x * std::f32::consts::FRAC_1_SQRT_2;
    let m = -s.abs();
    let square = s * s;
    let near = horner(&GELU_NEAR_ZERO, square).mul_add(s, 0.5);
    let u = -12.0 / (m - 2.0) - 3.0;
    let tail = exp2_scalar(square.mul_add(-std::f32::consts::LOG2_E, horner(&GELU_LOG2_TAIL, u)));
    let tail = if m + (ERF_SATURATION as f32) < 0.0 { 0.0 } else { tail };
    let far = if x < 0.0 { tail } else { tail.mul_add(-1.0, 1.0) };
    let cdf = if m + 1.0 < 0.0 { far } else { near };
    (cdf, exp2_scalar(square * -std::f32::consts::LOG2_E))
}

/// For `x sigmoid(z(x))` (GELU's tanh form when `gelu_tanh`, else SiLU) at one f32 `x`, as the
/// vector kernels compute them:
/// `(sigmoid(z), e / (1 + e)^2, dz/dx)` with `e = exp2(-|z| log2 e)` (the sigmoid
/// `z < 0 ? e r : r` and its slope `e r r`, `r = 1 / (1 + e)`), GELU's `z` summing its cube in
/// one multiply-add. The portable forward and backward kernels both read them.
pub(crate) fn sigmoid_terms(gelu_tanh: bool, x: f32) -> (f32, f32, f32) {
    let (z, dz) = if gelu_tanh {
        let square = x * x;
        let inner = (square * x).mul_add(GELU_CUBIC, x);
        let slope = square.mul_add(3.0 * GELU_CUBIC, 1.0);
        (GELU_TWICE_SQRT_2_OVER_PI * inner, GELU_TWICE_SQRT_2_OVER_PI * slope)
    } else {
        (x, 1.0)
    };
    let e = exp2_scalar(-z.abs() * std::f32::consts::LOG2_E);
    let r = 1.0 / (e + 1.0);
    let er = e * r;
    (if z < 0.0 { er } else { r }, er * r, dz)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `Phi(x)` in f64 from libm's `erfc`, 0 or 1 past the f32 `erf`'s saturation
    /// (`|x| / sqrt 2 > ERF_SATURATION`), as exact GELU's kernels take it.
    pub(crate) fn saturated_normal_cdf(x: f64) -> f64 {
        let s = x * std::f64::consts::FRAC_1_SQRT_2;
        if s.abs() > ERF_SATURATION { f64::from(u8::from(s > 0.0)) } else { 0.5 * libm::erfc(-s) }
    }

    /// The function in f64 from the f32 input, and the `z` whose rounding the tail magnifies.
    /// Exact GELU is `x Phi(x)`, `Phi` from `erfc`; its "`z`" is `x^2 / 2`, the exponent whose
    /// rounding its lower tail magnifies. Past the f32 `erf`'s saturation it is `x` or `-0`.
    fn reference(kind: Activation, x: f32) -> (f64, f64) {
        let x = f64::from(x);
        if kind == Activation::Gelu {
            return (x * saturated_normal_cdf(x), x * x / 2.0);
        }
        let z = match kind {
            Activation::GeluTanh => 2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x),
            _ => x,
        };
        let s = if z < 0.0 { z.exp() / (1.0 + z.exp()) } else { 1.0 / (1.0 + (-z).exp()) };
        (x * s, z)
    }

    fn check(kind: Activation, rows: usize, cols: usize, values: &dyn Fn(usize) -> f32) {
        let ld = cols + 3;
        let n = span("x", rows, cols, ld).unwrap();
        let input: Vec<f32> = (0..n).map(|i| if i % ld < cols { values(i) } else { -7.0 }).collect();
        for isa in Isa::ALL.into_iter().filter(|i| crate::machine::require_or_skip(i.name(), i.available())) {
            let mut x = input.clone();
            activate(isa, kind, rows, cols, ld, &mut x).unwrap();
            for (i, (&got, &arg)) in x.iter().zip(&input).enumerate() {
                if i % ld >= cols {
                    assert_eq!(got, -7.0, "{isa:?} {kind:?}: wrote the row gap at {i}");
                    continue;
                }
                let (want, z) = reference(kind, arg);
                let ok = if want.is_nan() {
                    got.is_nan()
                } else if want == 0.0 || want.is_infinite() {
                    f64::from(got) == want
                } else {
                    // The exponential's bound and a few roundings, plus the rounding of `z`
                    // (half an ulp, relative) magnified by the sigmoid's tail slope `|z|`. The
                    // exponential flushes below 2^-126.5 to 0 (as the loop's does), so a tail
                    // that small is only good to `|x| 2^-126` absolute.
                    let tol = 4.0 * crate::EXP2_MAX_REL_ERROR + (z.abs() + 4.0) * 2f64.powi(-23);
                    let err = (f64::from(got) - want).abs();
                    err <= tol * want.abs() || err <= f64::from(arg).abs() * 2f64.powi(-126)
                };
                assert!(ok, "{isa:?} {kind:?} x {arg} got {got} want {want}");
            }
        }
    }

    #[test]
    fn matches_f64_on_tails_strides_and_special_values() {
        for kind in Activation::ALL {
            for cols in [1, 7, 8, 15, 16, 17, 33, 100] {
                check(kind, 3, cols, &|i| ((i * 37) % 211) as f32 * 0.1 - 10.5);
            }
            let inf = f32::INFINITY;
            let specials = [
                0.0,
                -0.0,
                inf,
                -inf,
                f32::NAN,
                1e-30,
                -1e-30,
                1e4,
                -1e4,
                1e13,
                -1e13,
                87.0,
                -87.0,
                -100.0,
                3.0,
                // Exact GELU's branch points: `|x| / sqrt 2` at 1 and near 4.
                std::f32::consts::SQRT_2,
                -std::f32::consts::SQRT_2,
                -5.6,
                5.6,
            ];
            check(kind, 2, 40, &|i| specials[i % specials.len()]);
        }
    }

    #[test]
    fn every_kind_round_trips_its_code() {
        for (code, kind) in Activation::ALL.into_iter().enumerate() {
            assert_eq!(kind.code(), code as i64);
            assert_eq!(Activation::from_code(kind.code()), Some(kind));
        }
        assert_eq!(Activation::from_code(3), None);
    }

    #[test]
    fn bad_input_is_an_error_naming_the_operand() {
        let e = activate(Isa::Portable, Activation::Silu, 2, 4, 3, &mut [0.0; 8]).unwrap_err();
        assert!(matches!(e, TileError::LeadingDim { operand: "x", .. }), "{e:?}");
        let e = activate(Isa::Portable, Activation::Silu, 2, 4, 5, &mut [0.0; 8]).unwrap_err();
        assert_eq!(e, TileError::BufferTooSmall { operand: "x", needed: 9, len: 8 });
        // SAFETY: a negative size or an unknown code is refused before the pointer is read.
        unsafe {
            assert_eq!(uopc_tile_activation_f32(std::ptr::null_mut(), -1, 4, 4, 0), -1);
            assert_eq!(uopc_tile_activation_f32(std::ptr::null_mut(), 1, 4, 4, 9), -1);
        }
    }
}
