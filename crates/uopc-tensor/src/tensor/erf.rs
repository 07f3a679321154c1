//! The error function: in f64 a series of positive terms, in f32 a short odd polynomial near
//! zero and a fitted `erfc` beyond, both with the closed-form derivative as their gradient.

use super::Tensor;
use std::sync::{Arc, LazyLock};
use uopc_ir::DType;
// The f32 fits and saturation live with exact GELU's tile op, so both compute one function.
use uopc_tile::{
    ERF_LOG_ERFC_FIT as F32_LOG_ERFC_FIT, ERF_NEAR_ZERO_FIT as F32_NEAR_ZERO_FIT,
    ERF_POLYNOMIAL_BOUND as F32_POLYNOMIAL_BOUND, ERF_SATURATION as F32_SATURATION,
};

/// |x| from which the f64 `erf` is exactly ±1: it rounds to 1 there.
const F64_SATURATION: f64 = 6.0;

/// Terms of the f64 series, whose truncation at |x| = 6 stays below f64's rounding.
const F64_SERIES_TERMS: usize = 100;

/// The derivative of `erf`, `2/sqrt(pi) e^(-x^2)`, as [`Tensor::erf`]'s gradient rule (one
/// shared rule, so every erf node holds the same one).
static ERF_GRADIENT: LazyLock<Arc<super::GradientRule>> = LazyLock::new(|| {
    Arc::new(|x: &Tensor, g: &Tensor| {
        let slope = (x * x).neg().exp_exact().mul_lit(std::f64::consts::FRAC_2_SQRT_PI);
        g.try_mul(&slope)
    })
});

impl Tensor {
    /// The error function.
    ///
    /// - f32 (and bf16/f16, computed in f32): below |x| = 1 an odd polynomial of degree 11
    ///   (a near-minimax fit), from there `1 - exp(-x^2 + p(12 / (2 + |x|) - 3))` with `p` a
    ///   degree-8 fit of `ln(erfc(x)) + x^2`, and ±1 from |x| = 4, where erf rounds to it.
    ///   Error against f64 `erf`: below 2e-7 absolute and relative (about 3 f32 ulps).
    /// - f64: `2/sqrt(pi) e^(-x^2) sum_n (2x^2)^n x / (2n+1)!!`, a series of positive terms
    ///   (no cancellation) summed by Horner's rule, 100 terms, ±1 from |x| = 6. Relative
    ///   error about 1e-15.
    ///
    /// The gradient is the closed form `2/sqrt(pi) e^(-x^2)`
    /// ([`Tensor::try_with_gradient_rule`]), not the derivative of either approximation.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![0.5f64, -2.0, 30.0], &[3]).erf().to_ndarray::<f64>()?;
    /// assert!((y[0] - 0.520_499_877_813_046_5).abs() < 1e-15);
    /// assert!((y[1] + 0.995_322_265_018_952_7).abs() < 1e-15);
    /// assert_eq!(y[2], 1.0);
    /// let y = Tensor::from_vec(vec![0.5f32, -2.0, 30.0], &[3]).erf().to_ndarray::<f32>()?;
    /// assert!((y[0] - 0.520_499_9).abs() < 2e-7 && (y[1] + 0.995_322_3).abs() < 2e-7);
    /// assert_eq!(y[2], 1.0);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn erf(&self) -> Tensor {
        self.float_fn(|x| {
            // |x| as max(x, -x) + 0 (NaN stays NaN, -0 becomes +0): the gradient is the rule's
            // below, so abs's own selects (for its gradient's sign at 0) would be dead weight.
            let a = x.maximum(&x.neg()).add_lit(0.0);
            let (saturation, magnitude) = if x.dtype() == DType::F64 {
                (F64_SATURATION, erf_series(&a))
            } else {
                (F32_SATURATION, erf_f32(&a))
            };
            // Exactly 1 from the saturation on, so `1 + erf(x)` is exactly 0 far out (as in
            // libm); `a > saturation` is false for NaN, so NaN reaches the result.
            let value = x.odd_sign(&Tensor::select(&a.gt_lit(saturation), &a.lit(1.0), &magnitude));
            // Differentiating the approximation would cost more than evaluating it.
            value
                .try_with_gradient_rule(x, ERF_GRADIENT.clone())
                .expect("erf's value and argument are float tensors")
        })
    }
}

/// `erf(a)` for f32 `a = |x|` below the saturation (see [`Tensor::erf`]).
fn erf_f32(a: &Tensor) -> Tensor {
    let a2 = a * a;
    // By Horner's rule in a^2.
    let [near @ .., highest] = F32_NEAR_ZERO_FIT;
    let mut poly = a2.mul_lit(highest);
    for &c in near.iter().skip(1).rev() {
        poly = &poly.add_lit(c) * &a2;
    }
    let near_zero = &poly.add_lit(near[0]) * a;
    let u = a.add_lit(2.0).recip().mul_lit(12.0).add_lit(-3.0);
    let [rest @ .., last] = F32_LOG_ERFC_FIT;
    let mut fit = u.mul_lit(last);
    for &c in rest.iter().skip(1).rev() {
        fit = &fit.add_lit(c) * &u;
    }
    let erfc = (&fit.add_lit(rest[0]) - &a2).exp_exact();
    let beyond = erfc.rsub_lit(1.0);
    Tensor::select(&a.lt_lit(F32_POLYNOMIAL_BOUND), &near_zero, &beyond)
}

/// `erf(a)` for f64 `a = |x|`, by the series of positive terms, `a` clamped to the saturation
/// (the caller selects 1 past it).
fn erf_series(a: &Tensor) -> Tensor {
    let ac = Tensor::select(&a.gt_lit(F64_SATURATION), &a.lit(F64_SATURATION), a);
    let y = (&ac * &ac).mul_lit(2.0);
    let mut s = y.mul_lit(1.0 / (2 * F64_SERIES_TERMS + 1) as f64).add_lit(1.0);
    for n in (1..F64_SERIES_TERMS).rev() {
        s = (&s * &y).mul_lit(1.0 / (2 * n + 1) as f64).add_lit(1.0);
    }
    let gauss = (&ac * &ac).neg().exp_exact();
    (&(&s * &ac) * &gauss).mul_lit(std::f64::consts::FRAC_2_SQRT_PI)
}
