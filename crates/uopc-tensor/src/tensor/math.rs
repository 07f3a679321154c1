//! Float functions composed from the IR's ALU ops: `abs`, `tanh`, `sigmoid`, `silu`, `erf`,
//! `gelu`, `gelu_tanh`, `pow`, `minimum`, `clamp`.
//!
//! Every function is a small graph of existing ops (fusion makes each one kernel, and
//! autograd differentiates the graph), written so that no branch can overflow into a NaN:
//! each `where` feeds its unused branch an input that keeps it finite, because autograd
//! multiplies the unused branch's gradient by zero, and `0 * inf` would be NaN. Constants are
//! of the tensor's own dtype (f64 tensors get f64 constants); 16-bit tensors compute in f32,
//! and integer and bool tensors give f32 results (except `abs` and `minimum`, which keep
//! integers).

use super::scalar::{Scalar, sealed::Sealed};
use super::{GradientRule, Tensor, ok};
use crate::error::Result;
use std::sync::Arc;
use uopc_ir::{BinaryOp, ConstValue, DType, Op, UOp, const_of};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// Below this magnitude `tanh` is its odd Taylor series (where `1 - e^{-2|x|}` would cancel).
const TANH_SERIES_BOUND: f64 = 0.25;

/// The odd Taylor coefficients of `tanh` (`tanh x = sum a_n x^(2n+1)`), from `tanh' = 1 - tanh^2`:
/// `(2n+1) a_n = [n = 0] - sum_{i+j=n-1} a_i a_j`.
fn tanh_series(terms: usize) -> Vec<f64> {
    let mut a: Vec<f64> = Vec::with_capacity(terms);
    for n in 0..terms {
        let conv: f64 = (0..n).map(|i| a[i] * a[n - 1 - i]).sum();
        let delta = if n == 0 { 1.0 } else { 0.0 };
        a.push((delta - conv) / (2 * n + 1) as f64);
    }
    a
}

impl Tensor {
    /// A 0-d constant of this tensor's dtype (it broadcasts implicitly in binary ops).
    pub(crate) fn lit(&self, v: f64) -> Tensor {
        Tensor::from_uop(const_of(v, self.dtype()))
    }

    /// `self op v` with `v` a constant of this (f32 or f64) tensor's dtype.
    fn op_lit(&self, op: BinaryOp, v: f64) -> Tensor {
        let c = const_of(v, self.dtype());
        Tensor::from_uop(UOp::new(Op::Binary(op), self.dtype(), vec![self.uop().clone(), c]))
    }
    pub(crate) fn add_lit(&self, v: f64) -> Tensor {
        self.op_lit(BinaryOp::Add, v)
    }
    pub(crate) fn mul_lit(&self, v: f64) -> Tensor {
        self.op_lit(BinaryOp::Mul, v)
    }
    /// `v - self`.
    pub(super) fn rsub_lit(&self, v: f64) -> Tensor {
        self.neg().add_lit(v)
    }
    /// `e^x` with `log2 e` of this tensor's dtype (an f32 constant would cost f64 tensors
    /// about 1e-8 relative per unit of `x`).
    pub(crate) fn exp_exact(&self) -> Tensor {
        self.mul_lit(LOG2E).exp2()
    }
    /// `ln x` with `ln 2` of this tensor's dtype.
    pub(crate) fn ln_exact(&self) -> Tensor {
        self.log2().mul_lit(LN2)
    }
    /// A tensor of this tensor's shape filled with `v`.
    pub(crate) fn filled_like(&self, v: f64) -> Tensor {
        self.lit(v).filled_to(self.shape())
    }
    /// This 0-d tensor broadcast to `shape`.
    pub(crate) fn filled_to(&self, shape: &[usize]) -> Tensor {
        if shape.is_empty() {
            return self.clone();
        }
        self.reshape(&vec![1; shape.len()]).expand(shape)
    }
    /// `self < v` for a constant `v`.
    pub(super) fn lt_lit(&self, v: f64) -> Tensor {
        let c = const_of(v, self.dtype());
        Tensor::from_uop(UOp::new(Op::Binary(BinaryOp::CmpLt), DType::Bool, vec![self.uop().clone(), c]))
    }
    /// `v < self` for a constant `v`.
    pub(super) fn gt_lit(&self, v: f64) -> Tensor {
        let c = const_of(v, self.dtype());
        Tensor::from_uop(UOp::new(Op::Binary(BinaryOp::CmpLt), DType::Bool, vec![c, self.uop().clone()]))
    }
    /// `cond ? a : b`, all three of one shape or 0-d constants (never a shape error).
    pub(super) fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        ok(cond.try_where(a, b))
    }

    /// `f(x)` on this tensor as a float: 16-bit tensors widened to f32 and rounded back,
    /// bools as f32, f32 and f64 as they are.
    pub(super) fn float_fn(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        if self.dtype().is_half() { self.via_f32(f) } else { f(&self.float()) }
    }

    /// `|x|`, as `x > 0 ? x : x < 0 ? -x : x + 0` with the last branch detached: NaN stays
    /// NaN, `abs(-0.0)` is `+0.0` (as in IEEE 754 and torch, because `-0.0 + 0.0` is `+0.0`),
    /// and the gradient is torch's `sign(x)`, 0 at 0 (and at NaN); integer tensors stay
    /// integers (wrapping at the minimum, as torch's do).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![-2.0f32, 0.5], &[2]).abs();
    /// assert_eq!(y.to_ndarray::<f32>()?.as_slice(), Some(&[2.0, 0.5][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn abs(&self) -> Tensor {
        if self.dtype().is_int() {
            return Tensor::select(&self.lt_lit(0.0), &self.neg(), self);
        }
        self.float_fn(|x| {
            let zero_or_nan = x.detach().add_lit(0.0);
            Tensor::select(&x.gt_lit(0.0), x, &Tensor::select(&x.lt_lit(0.0), &x.neg(), &zero_or_nan))
        })
    }

    /// The sign of `x` as -1 or 1 (0 counts as positive), for odd functions.
    pub(super) fn odd_sign(&self, magnitude: &Tensor) -> Tensor {
        Tensor::select(&self.lt_lit(0.0), &magnitude.neg(), magnitude)
    }

    /// Hyperbolic tangent: `(1 - e) / (1 + e)` with `e = exp(-2|x|)` (never overflows, so
    /// `tanh(±1e4) = ±1`), its odd Taylor series below |x| = 0.25 where that quotient would
    /// cancel, and the sign of `x`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![-1e4f32, 0.5, 30.0], &[3]).tanh().to_ndarray::<f32>()?;
    /// assert_eq!((y[0], y[2]), (-1.0, 1.0));
    /// assert!((y[1] - 0.5f32.tanh()).abs() < 1e-7);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn tanh(&self) -> Tensor {
        self.float_fn(|x| {
            // Series terms until the next one is below the dtype's rounding at the bound.
            let terms = if x.dtype() == DType::F64 { 11 } else { 5 };
            let a = x.abs();
            let small = a.lt_lit(TANH_SERIES_BOUND);
            // Zero outside the series' range keeps that branch (and its gradient) finite.
            let xs = Tensor::select(&small, x, &x.lit(0.0));
            let x2 = &xs * &xs;
            let coeffs = tanh_series(terms);
            let mut poly = x2.mul_lit(coeffs[terms - 1]).add_lit(coeffs[terms - 2]);
            for &c in coeffs[..terms - 2].iter().rev() {
                poly = (&poly * &x2).add_lit(c);
            }
            let series = &poly * &xs;
            let e = a.mul_lit(-2.0).exp_exact();
            let r = e.add_lit(1.0).recip();
            let big = &e.rsub_lit(1.0) * &r;
            let value = Tensor::select(&small, &series, &x.odd_sign(&big));
            // tanh' = 1 - tanh^2 = 4 e / (1 + e)^2, from the values computed above (no
            // cancellation where tanh is near 1, and no derivative of the series or the sign).
            let slope = (&(&e * &r) * &r).mul_lit(4.0);
            let rule: Arc<GradientRule> = Arc::new(move |_, g| Ok(g * &slope));
            value.try_with_gradient_rule(x, rule).expect("tanh's value and argument are float tensors")
        })
    }

    /// The logistic function `1 / (1 + e^-x)`, computed from `e = exp(-|x|)` (so it never
    /// overflows, nor does its gradient) as `1 / (1 + e)` for `x >= 0` and `e / (1 + e)` below.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![-1e4f32, 0.0, 1e4], &[3]).sigmoid();
    /// assert_eq!(y.to_ndarray::<f32>()?.as_slice(), Some(&[0.0, 0.5, 1.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn sigmoid(&self) -> Tensor {
        self.float_fn(|x| {
            let e = x.abs().neg().exp_exact();
            let r = e.add_lit(1.0).recip();
            let value = Tensor::select(&x.lt_lit(0.0), &(&e * &r), &r);
            // sigmoid' = e / (1 + e)^2 on both sides, from the values computed above (exact in
            // the tails, where s (1 - s) would cancel to 0).
            let slope = &(&e * &r) * &r;
            let rule: Arc<GradientRule> = Arc::new(move |_, g| Ok(g * &slope));
            value.try_with_gradient_rule(x, rule).expect("sigmoid's value and argument are float tensors")
        })
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f64], &[1]).silu().to_ndarray::<f64>()?;
    /// assert!((y[0] - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn silu(&self) -> Tensor {
        self.float_fn(|x| x * &x.sigmoid())
    }

    /// GELU, exact: `x/2 (1 + erf(x / sqrt 2))` (torch's `gelu`).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f64], &[1]).gelu().to_ndarray::<f64>()?;
    /// assert!((y[0] - 0.841_344_746_068_542_9).abs() < 1e-15);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn gelu(&self) -> Tensor {
        self.float_fn(|x| {
            let cdf = x.mul_lit(std::f64::consts::FRAC_1_SQRT_2).erf().add_lit(1.0);
            (x * &cdf).mul_lit(0.5)
        })
    }

    /// GELU, tanh approximation (GPT-2's, torch's `gelu(approximate="tanh")`):
    /// `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, computed as `x sigmoid(2 u)` with
    /// `u = sqrt(2/pi) (x + 0.044715 x^3)` (the same function, since `(1 + tanh u) / 2 =
    /// sigmoid(2u)`), which needs one exponential and no series.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f32, -1e4], &[2]).gelu_tanh().to_ndarray::<f32>()?;
    /// assert!((y[0] - 0.841_192).abs() < 1e-6 && y[1] == 0.0);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn gelu_tanh(&self) -> Tensor {
        self.float_fn(|x| {
            let cube = &(x * x) * x;
            let twice_inner =
                (x + &cube.mul_lit(0.044_715)).mul_lit(2.0 * (2.0 / std::f64::consts::PI).sqrt());
            x * &twice_inner.sigmoid()
        })
    }

    /// `self ^ exponent` elementwise with broadcasting, as torch's `pow`: `exp2(y log2 |x|)`,
    /// negated for a negative `x` with an odd integer `y`, NaN for a negative `x` with a
    /// non-integer `y`, and 1 for `y = 0` (NaN and 0 bases included). The gradient is that of
    /// this composition (undefined where `x = 0`; use [`Tensor::pow_scalar`] for integer powers).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![-2.0f64, 4.0, -8.0], &[3]);
    /// let y = Tensor::from_vec(vec![3.0f64, 0.5, 0.5], &[3]);
    /// let p = x.try_pow(&y)?.to_ndarray::<f64>()?;
    /// assert!((p[0] + 8.0).abs() < 1e-13 && (p[1] - 2.0).abs() < 1e-14 && p[2].is_nan());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `pow` when the shapes do not broadcast.
    pub fn try_pow(&self, exponent: &Tensor) -> Result<Tensor> {
        let (x, y) = self.broadcast_pair(exponent, "pow")?;
        Ok(x.float_fn(|x| {
            let y = y.cast(x.dtype());
            let mag = (&y * &x.abs().log2()).exp2();
            let yi = y.cast(DType::I64);
            let integral = yi.cast(x.dtype()).eq(&y);
            let two = Tensor::from_uop(const_of(2.0, DType::I64));
            let odd = Tensor::from_uop(UOp::new(
                Op::Binary(BinaryOp::Mod),
                DType::I64,
                vec![yi.uop().clone(), two.uop().clone()],
            ))
            .ne(&Tensor::from_uop(const_of(0.0, DType::I64)));
            let signed = Tensor::select(&odd, &mag.neg(), &mag);
            let negative_base = Tensor::select(&integral, &signed, &x.lit(f64::NAN));
            let r = Tensor::select(&x.lt_lit(0.0), &negative_base, &mag);
            Tensor::select(&y.eq(&y.lit(0.0)), &x.lit(1.0), &r)
        }))
    }
    /// [`Tensor::try_pow`], panicking on shapes that do not broadcast.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn pow(&self, exponent: &Tensor) -> Tensor {
        ok(self.try_pow(exponent))
    }

    /// `self ^ p` for a scalar `p` (converted to the tensor's dtype, so an f64 tensor gets the
    /// f64 `p`): integer powers with |p| <= 16 by repeated squaring (exact products, and
    /// gradients defined at 0), `p = ±0.5` by `sqrt`, others as [`Tensor::pow`]. An integer
    /// tensor with a non-negative integer `p` stays an integer tensor (products that wrap, as
    /// torch's do); with any other `p` it computes in f32.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![-3.0f32, 2.0], &[2]);
    /// assert_eq!(x.pow_scalar(3.0).to_ndarray::<f32>()?.as_slice(), Some(&[-27.0, 8.0][..]));
    /// assert_eq!(x.pow_scalar(-1.0).to_ndarray::<f32>()?.as_slice(), Some(&[-1.0 / 3.0, 0.5][..]));
    /// let n = Tensor::from_vec(vec![-3i64, 2], &[2]);
    /// assert_eq!(n.pow_scalar(3).to_ndarray::<i64>()?.as_slice(), Some(&[-27, 8][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn pow_scalar(&self, p: impl Scalar) -> Tensor {
        let p = p.operand();
        if self.dtype().is_int()
            && let ConstValue::Int(n) = p.value
            && n >= 0
        {
            return if n == 0 { self.filled_like(1.0) } else { self.power_by_squaring(n.unsigned_abs()) };
        }
        let p = p.as_f64();
        self.float_fn(|x| {
            if p == 0.0 {
                return x.filled_like(1.0);
            }
            if p.fract() == 0.0 && p.abs() <= 16.0 {
                let r = x.power_by_squaring(p.abs() as u64);
                return if p < 0.0 { r.recip() } else { r };
            }
            if p.abs() == 0.5 {
                let r = x.sqrt();
                return if p < 0.0 { r.recip() } else { r };
            }
            x.pow(&x.lit(p))
        })
    }

    /// `self ^ n` for `n >= 1` as products of repeated squares (`log2 n` squarings).
    fn power_by_squaring(&self, n: u64) -> Tensor {
        debug_assert!(n >= 1);
        let (mut result, mut square, mut n) = (None::<Tensor>, self.clone(), n);
        while n > 0 {
            if n & 1 == 1 {
                result = Some(match result {
                    Some(r) => &r * &square,
                    None => square.clone(),
                });
            }
            n >>= 1;
            if n > 0 {
                square = &square * &square;
            }
        }
        result.expect("n >= 1 has a set bit")
    }

    /// A 0-d tensor of this tensor's dtype holding `v` converted once to it (integers from a
    /// float truncate, as a cast does): the scalar operand of a broadcasting op, such as a
    /// branch of [`Tensor::try_where`], that must not round `v` through f32 on an f64 tensor.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f64, 2.0], &[2]);
    /// let y = x.lt(&x.scalar_like(0)).try_where(&x.scalar_like(0.1), &x)?;
    /// assert_eq!(y.to_ndarray::<f64>()?.as_slice(), Some(&[0.1, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn scalar_like(&self, v: impl Scalar) -> Tensor {
        self.const_like(v.operand().value)
    }

    /// `v` as a 0-d constant of this tensor's dtype.
    fn const_like(&self, v: ConstValue) -> Tensor {
        let d = self.dtype();
        Tensor::from_uop(UOp::new(Op::Const(v.cast(d)), d, vec![]))
    }

    /// `self < other` for operands of one dtype, each of the result's shape or 0-d (no
    /// broadcast nodes: a 0-d constant broadcasts implicitly).
    fn compare_lt(&self, other: &Tensor) -> Tensor {
        let src = vec![self.uop().clone(), other.uop().clone()];
        Tensor::from_uop(UOp::new(Op::Binary(BinaryOp::CmpLt), DType::Bool, src))
    }

    /// A tensor of this tensor's shape and dtype filled with `v` (converted as
    /// [`Tensor::scalar_like`] converts it): torch's `full_like`, a broadcast constant.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f64; 3], &[3]);
    /// assert_eq!(x.full_like(0.1).to_ndarray::<f64>()?.as_slice(), Some(&[0.1; 3][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn full_like(&self, v: impl Scalar) -> Tensor {
        self.scalar_like(v).filled_to(self.shape())
    }

    /// Elementwise minimum with broadcasting, `-max(-a, -b)`: NaN if either operand is NaN,
    /// as torch's `minimum`; ties split the gradient evenly, as `maximum`'s do.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 5.0], &[2]);
    /// let m = a.try_minimum(&Tensor::scalar(3.0))?;
    /// assert_eq!(m.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 3.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `minimum` when the shapes do not broadcast.
    pub fn try_minimum(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, "minimum")?;
        Ok(a.neg().try_maximum(&b.neg()).map_err(|e| e.in_op("minimum"))?.neg())
    }
    /// [`Tensor::try_minimum`], panicking on shapes that do not broadcast.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn minimum(&self, other: &Tensor) -> Tensor {
        ok(self.try_minimum(other))
    }

    /// `x` limited to `[min, max]` (either bound optional), as torch's `clamp`: the lower bound
    /// first, then the upper, so `min > max` gives `max` everywhere; NaN stays NaN; the
    /// gradient is 1 inside the bounds (on them included) and 0 outside. The bounds take the
    /// tensor's dtype (f64 bounds on an f64 tensor); an integer tensor with integer bounds
    /// stays an integer tensor, with float bounds it computes in f32. With neither bound the
    /// bound type must be named (`clamp(None::<f64>, None)`).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![-2.0f32, 0.5, 9.0], &[3]).clamp(Some(0.0), Some(1.0));
    /// assert_eq!(y.to_ndarray::<f32>()?.as_slice(), Some(&[0.0, 0.5, 1.0][..]));
    /// let n = Tensor::from_vec(vec![-2i32, 5, 9], &[3]).clamp(Some(0), Some(6));
    /// assert_eq!(n.to_ndarray::<i32>()?.as_slice(), Some(&[0, 5, 6][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn clamp<S: Scalar>(&self, min: Option<S>, max: Option<S>) -> Tensor {
        let (min, max) = (min.map(Sealed::operand), max.map(Sealed::operand));
        let limit = |x: &Tensor| {
            let mut y = x.clone();
            if let Some(lo) = min {
                let lo = y.const_like(lo.value);
                y = Tensor::select(&y.compare_lt(&lo), &lo, &y);
            }
            if let Some(hi) = max {
                let hi = y.const_like(hi.value);
                y = Tensor::select(&hi.compare_lt(&y), &hi, &y);
            }
            y
        };
        let integral_bounds = min.iter().chain(&max).all(|b| b.dtype.is_int());
        if self.dtype().is_int() && integral_bounds { limit(self) } else { self.float_fn(limit) }
    }
}

#[cfg(test)]
mod tests {
    use super::tanh_series;

    #[test]
    fn tanh_series_matches_the_known_coefficients() {
        let a = tanh_series(5);
        let known = [1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0];
        for (x, k) in a.iter().zip(known) {
            assert!((x - k).abs() < 1e-16, "{x} vs {k}");
        }
    }
}
