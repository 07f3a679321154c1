//! The backward of [`crate::activate`]: a gradient block scaled by the activation's derivative
//! at the saved input, in place ([`activate_grad`]).
//!
//! For `f(x) = x sigmoid(z(x))`, `f'(x) = s + x s' z'(x)` with `s = sigmoid(z)` and
//! `s' = e / (1 + e)^2`, both from the one `e = exp2(-|z| log2 e)` the forward takes (exact in
//! the tails, where `s (1 - s)` would cancel); `z' = 2 sqrt(2/pi) (1 + 3 0.044715 x^2)` for
//! GELU's tanh form, 1 for SiLU. For exact GELU, `f(x) = x Phi(x)`, `f'(x) = Phi(x) + x phi(x)`
//! with the normal density `phi(x) = e^(-x^2/2) / sqrt(2 pi)`. This is the gradient the tensor
//! graph's autograd derives from `gelu_tanh`, `silu` and `gelu`, in one pass where generated
//! code takes Cranelift's 128-bit exponential and division per four elements.

use crate::activation::{normal_cdf_terms, sigmoid_terms};
use crate::activation_kind::{Activation, GELU_DENSITY};
use crate::error::{check_len, span};
use crate::{Isa, TileError};

/// `G = G * kind'(X)` over `rows x cols` blocks, X with row stride `ldx` (only read), G with
/// `ldg`.
///
/// Accuracy as [`crate::activate`]'s: a few ulps of the formula on the f32 `x`, times
/// `1 + |z| 2^-23` in the sigmoid's tails. Special values follow the formula: NaN in either
/// operand gives NaN; an infinite `x` gives NaN (`x s'` is `inf * 0`). Row gaps are not touched.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`] if this CPU lacks
/// `isa`; [`TileError::LeadingDim`] naming `"x"` or `"g"` when its stride is below `cols` with
/// two or more rows; [`TileError::BufferTooSmall`] if a slice is shorter than its block.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Activation, Isa, TileError, activate_grad};
///
/// // SiLU' (0) = 1/2; GELU' at 0 is 1/2 too.
/// let mut g = [2.0f32, 2.0];
/// activate_grad(Isa::detect(), Activation::Silu, 1, 2, 2, 2, &[0.0, 0.0], &mut g)?;
/// assert_eq!(g, [1.0, 1.0]);
/// # Ok::<(), TileError>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn activate_grad(
    isa: Isa,
    kind: Activation,
    rows: usize,
    cols: usize,
    ldx: usize,
    ldg: usize,
    x: &[f32],
    g: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_len("x", span("x", rows, cols, ldx)?, x.len())?;
    check_len("g", span("g", rows, cols, ldg)?, g.len())?;
    // SAFETY: the ISA is available, both slices cover their blocks, and `g` is a unique borrow
    // (so it does not overlap `x`).
    unsafe { activate_grad_unchecked(isa, kind, [rows, cols, ldx, ldg], x.as_ptr(), g.as_mut_ptr()) };
    Ok(())
}

/// [`activate_grad`] on raw pointers, without checks; `shape` is `[rows, cols, ldx, ldg]`.
///
/// # Safety
///
/// `isa.available()` is true; `x` is valid for reads and `g` for reads and writes of their
/// blocks (row `r < rows` at `r * ldx` and `r * ldg`, `cols` floats each), aligned for `f32`,
/// not overlapping, and nothing else writes them during the call.
pub unsafe fn activate_grad_unchecked(
    isa: Isa,
    kind: Activation,
    shape: [usize; 4],
    x: *const f32,
    g: *mut f32,
) {
    let [rows, cols, ldx, ldg] = shape;
    if cols == 0 {
        return;
    }
    for r in 0..rows {
        // SAFETY: row `r` spans `cols` floats at `r * ldx` in X and `r * ldg` in G.
        unsafe {
            let (xr, gr) = (x.add(r * ldx), g.add(r * ldg));
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX-512.
                Isa::Avx512 => crate::x86::activation::grad_row_avx512(kind, xr, gr, cols),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller guarantees AVX2 and FMA.
                Isa::Avx2Fma => crate::x86::activation::grad_row_avx2(kind, xr, gr, cols),
                _ => {
                    for j in 0..cols {
                        *gr.add(j) *= derivative(kind, *xr.add(j));
                    }
                }
            }
        }
    }
}

/// Flat C-ABI [`activate_grad`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `x`, `g` (pointers to f32), then the `i64`s `rows`, `cols`, `ldx`,
/// `ldg` and the activation's [`Activation::code`]. Returns 0 on success, or -1 without
/// touching memory if a size is negative, a stride is too small, an extent overflows, the code
/// is unknown, or a pointer is null while the blocks are non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`activate_grad_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_activation_grad_f32(
    x: *const f32,
    g: *mut f32,
    rows: i64,
    cols: i64,
    ldx: i64,
    ldg: i64,
    kind: i64,
) -> i32 {
    let u = |v: i64| usize::try_from(v).ok();
    let (Some(rows), Some(cols), Some(ldx), Some(ldg), Some(kind)) =
        (u(rows), u(cols), u(ldx), u(ldg), Activation::from_code(kind))
    else {
        return -1;
    };
    let (Ok(nx), Ok(_)) = (span("x", rows, cols, ldx), span("g", rows, cols, ldg)) else { return -1 };
    if nx > 0 && (x.is_null() || g.is_null()) {
        return -1;
    }
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { activate_grad_unchecked(Isa::detect(), kind, [rows, cols, ldx, ldg], x, g) };
    0
}

/// `kind'(x)` on one f32, as the vector kernels compute it (the portable kernel).
fn derivative(kind: Activation, x: f32) -> f32 {
    if kind == Activation::Gelu {
        let (cdf, gauss) = normal_cdf_terms(x);
        return (x * gauss).mul_add(GELU_DENSITY, cdf);
    }
    let (s, slope, dz) = sigmoid_terms(kind == Activation::GeluTanh, x);
    (x * slope).mul_add(dz, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::tests::saturated_normal_cdf;

    /// The derivative in f64 from the f32 input (the true one: `s + x s(1-s) z'`), with `z`.
    /// Exact GELU's is `Phi(x) + x phi(x)`, with `x^2 / 2` as its `z`; `Phi` is 0 or 1 past the
    /// f32 `erf`'s saturation, as the forward's.
    fn reference(kind: Activation, x: f32) -> (f64, f64) {
        let x = f64::from(x);
        if kind == Activation::Gelu {
            let density = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            return (saturated_normal_cdf(x) + x * density, x * x / 2.0);
        }
        let c = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
        let (z, dz) = match kind {
            Activation::GeluTanh => (c * (x + 0.044_715 * x * x * x), c * (1.0 + 3.0 * 0.044_715 * x * x)),
            _ => (x, 1.0),
        };
        let e = (-z.abs()).exp();
        let s = if z < 0.0 { e / (1.0 + e) } else { 1.0 / (1.0 + e) };
        (s + x * e / ((1.0 + e) * (1.0 + e)) * dz, z)
    }

    #[test]
    fn matches_f64_on_tails_strides_and_special_values() {
        for kind in Activation::ALL {
            for cols in [1, 7, 8, 15, 16, 17, 33, 100] {
                let (rows, ldx, ldg) = (3, cols + 2, cols + 5);
                let x: Vec<f32> = (0..span("x", rows, cols, ldx).unwrap())
                    .map(|i| ((i * 37) % 211) as f32 * 0.1 - 10.5)
                    .collect();
                let g0: Vec<f32> = (0..span("g", rows, cols, ldg).unwrap())
                    .map(|i| if i % ldg < cols { 1.0 + (i % 5) as f32 * 0.25 } else { -7.0 })
                    .collect();
                for isa in
                    Isa::ALL.into_iter().filter(|i| crate::machine::require_or_skip(i.name(), i.available()))
                {
                    let mut g = g0.clone();
                    activate_grad(isa, kind, rows, cols, ldx, ldg, &x, &mut g).unwrap();
                    for r in 0..rows {
                        for j in 0..ldg.min(g.len() - r * ldg) {
                            let (got, seed) = (g[r * ldg + j], g0[r * ldg + j]);
                            if j >= cols {
                                assert_eq!(got, -7.0, "{isa:?} {kind:?}: wrote the gap of row {r}");
                                continue;
                            }
                            let arg = x[r * ldx + j];
                            let (d, z) = reference(kind, arg);
                            let want = f64::from(seed) * d;
                            // As the forward's bound; the sum `s + x s' z'` can cancel (GELU'
                            // dips below 0 near x = -0.75), so the error is also taken
                            // against the size of its terms.
                            let tol = 8.0 * crate::EXP2_MAX_REL_ERROR + (z.abs() + 8.0) * 2f64.powi(-23);
                            let scale = f64::from(seed) * (1.0 + f64::from(arg).abs() * (1.0 + z.abs()));
                            let err = (f64::from(got) - want).abs();
                            assert!(
                                err <= tol * scale || err <= f64::from(arg).abs() * 2f64.powi(-120),
                                "{isa:?} {kind:?} x {arg} got {got} want {want}"
                            );
                        }
                    }
                }
            }
            // Special values: NaN and infinities give NaN, as the formula does.
            for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for isa in
                    Isa::ALL.into_iter().filter(|i| crate::machine::require_or_skip(i.name(), i.available()))
                {
                    let mut g = [1.0f32; 3];
                    activate_grad(isa, kind, 1, 3, 3, 3, &[v, 0.0, 1e-30], &mut g).unwrap();
                    assert!(g[0].is_nan() && g[1] == 0.5 && g[2] == 0.5, "{isa:?} {kind:?} {v}: {g:?}");
                }
            }
        }
    }

    #[test]
    fn bad_input_is_an_error_naming_the_operand() {
        let (x, mut g) = ([0.0f32; 8], [0.0f32; 8]);
        let e = activate_grad(Isa::Portable, Activation::Silu, 2, 4, 3, 4, &x, &mut g).unwrap_err();
        assert!(matches!(e, TileError::LeadingDim { operand: "x", .. }), "{e:?}");
        let e = activate_grad(Isa::Portable, Activation::Silu, 2, 4, 4, 5, &x, &mut g).unwrap_err();
        assert_eq!(e, TileError::BufferTooSmall { operand: "g", needed: 9, len: 8 });
        // SAFETY: a negative size or an unknown code is refused before the pointers are read.
        unsafe {
            let (xp, gp) = (std::ptr::null(), std::ptr::null_mut());
            assert_eq!(uopc_tile_activation_grad_f32(xp, gp, -1, 4, 4, 4, 0), -1);
            assert_eq!(uopc_tile_activation_grad_f32(xp, gp, 1, 4, 4, 4, 7), -1);
        }
    }
}
