//! Reductions and normalizations built from `sum` and `max`: `min`, `mean`, `var`,
//! `logsumexp`, `log_softmax`, `cross_entropy`, `layer_norm`.
//!
//! Each is a composition of existing ops, so fusion and autograd apply unchanged; the
//! exponentials are max-subtracted (the max detached: it cancels in the value, and its own
//! gradient would only add the tie-splitting of `max`'s rule to a sum that is zero anyway).

use super::custom::CustomVjp;
use super::{Tensor, ok};
use crate::error::{Result, TensorError, shape_err};
use std::sync::{Arc, LazyLock};
use uopc_ir::{AxisType, CustomKernel, DType, DataRef, Op, UOp, buffer, range, sink};

/// `x[i, t[i]]` for `x` of shape `(n, c)` and `t` of `n` i64 class indices (checked below `c`
/// by the caller; clamped here so every load is provably in bounds).
fn pick_program(n: usize, c: usize, dtype: DType) -> UOp {
    let (x, t, out) = (buffer(0, dtype, n * c), buffer(1, DType::I64, n), buffer(2, dtype, n));
    let i = range(n, 0, AxisType::Loop);
    let j = t.index(&i).load().cast(DType::INDEX).maximum(0i64);
    let j = -(-j).maximum(-(c as i64 - 1));
    sink(&[out.index(&i).store(x.index(&i * c as i64 + j).load()).end(&[i])])
}

/// The gradient rule of the picks, one value for the process (a custom kernel's rule is part
/// of its node, so a fresh rule per call would make every call a new plan): the cotangent of
/// row `i` at column `t[i]`, as a one-hot computed from the targets where it is read.
static PICK_VJP: LazyLock<DataRef> = LazyLock::new(|| {
    let rule: Arc<CustomVjp> = Arc::new(|sources: &[Tensor], _out: &Tensor, cot: &Tensor| {
        let (x, t) = (&sources[0], &sources[1]);
        let (n, c) = (x.shape()[0], x.shape()[1]);
        let hot = Tensor::arange(c).try_reshape(&[1, c])?.try_eq(t)?;
        let cot = cot.try_reshape(&[n, 1])?;
        Ok(vec![Some(hot.try_where(&cot, &cot.lit(0.0))?), None])
    });
    DataRef(Arc::new(rule))
});

impl Tensor {
    /// Minimum over `axis`, as `-max(-x)`: NaN in a row gives NaN, like torch.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, -1.0, 2.0, 5.0], &[2, 2]);
    /// assert_eq!(x.try_min(1, false)?.to_ndarray::<f32>()?.as_slice(), Some(&[-1.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `min` when `axis` is out of range or
    /// has size 0 (a minimum of nothing is undefined, as in torch).
    pub fn try_min(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.axis("min", axis)?;
        Ok(self.neg().try_max(axis, keepdim).map_err(|e| e.in_op("min"))?.neg())
    }
    /// [`Tensor::try_min`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range or of size 0 (the error [`Tensor::try_min`] returns).
    #[track_caller]
    pub fn min(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_min(axis, keepdim))
    }

    /// Mean over `axis`: the sum times `1/n` (a constant of the tensor's dtype); NaN over an
    /// axis of size 0, like torch.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 6.0], &[2, 2]);
    /// assert_eq!(x.try_mean(-1, false)?.to_ndarray::<f64>()?.as_slice(), Some(&[1.5, 4.5][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `mean` when `axis` is out of range.
    pub fn try_mean(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis("mean", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.mean(axis, keepdim)));
        }
        let n = self.shape()[a] as f64;
        Ok(self.float().try_sum(axis, keepdim).map_err(|e| e.in_op("mean"))?.mul_lit(1.0 / n))
    }
    /// [`Tensor::try_mean`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_mean`] returns).
    #[track_caller]
    pub fn mean(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_mean(axis, keepdim))
    }

    /// Variance over `axis` with torch's `correction`: `sum((x - mean)^2) / (n - correction)`
    /// (0 is the population variance, 1 the unbiased sample variance), two passes for
    /// accuracy. `n <= correction` divides by zero (inf, or NaN for a zero sum), as torch does.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[4]);
    /// assert_eq!(x.try_var(0, 0, false)?.to_ndarray::<f64>()?[[]], 1.25);
    /// assert!((x.try_var(0, 1, false)?.to_ndarray::<f64>()?[[]] - 5.0 / 3.0).abs() < 1e-15);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `var` when `axis` is out of range.
    pub fn try_var(&self, axis: isize, correction: usize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis("var", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.var(axis, correction, keepdim)));
        }
        let var = || -> Result<Tensor> {
            let x = self.float();
            let d = x.try_sub(&x.try_mean(axis, true)?)?;
            let dof = self.shape()[a].saturating_sub(correction) as f64;
            Ok((&d * &d).try_sum(axis, keepdim)?.mul_lit(1.0 / dof))
        };
        var().map_err(|e| e.in_op("var"))
    }
    /// [`Tensor::try_var`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_var`] returns).
    #[track_caller]
    pub fn var(&self, axis: isize, correction: usize, keepdim: bool) -> Tensor {
        ok(self.try_var(axis, correction, keepdim))
    }

    /// The row maximum with infinities replaced by 0 and gradients stopped: the shift that
    /// keeps `exp(x - shift)` in range (an all `-inf` row must give `exp(-inf) = 0`, not NaN).
    fn finite_shift(&self, axis: isize) -> Result<Tensor> {
        let m = self.try_max(axis, true)?.detach();
        let zero = m.lit(0.0);
        let above_neg_inf = m.try_gt(&m.lit(f64::NEG_INFINITY))?.try_where(&m, &zero)?;
        m.try_lt(&m.lit(f64::INFINITY))?.try_where(&above_neg_inf, &zero)
    }

    /// `v` where the row maximum of `self` over `axis` is below `+inf`, NaN where it is `+inf`
    /// (or NaN): the probabilities of a row with an infinite logit are undefined, and torch's
    /// `log_softmax` and `cross_entropy` give NaN for the whole row. The maximum is the node
    /// [`Tensor::finite_shift`] reads (nodes are interned), so no reduction is added.
    fn nan_where_max_is_inf(&self, axis: isize, v: &Tensor) -> Result<Tensor> {
        let m = self.try_max(axis, true)?.detach();
        m.try_lt(&m.lit(f64::INFINITY))?.try_where(v, &v.lit(f64::NAN))
    }

    /// The sum over `axis` of a softmax-like row as one loop: the online row kernels recognize
    /// the max-shifted sums in this form and split long rows into chunks of their own.
    fn row_sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(uopc_ir::ReduceOp::Add, axis, keepdim, "sum")
    }

    /// `log(sum(exp(x)))` over `axis`, computed as `m + log(sum(exp(x - m)))` with `m` the
    /// row maximum, so large values do not overflow (`logsumexp([1000, 1000]) = 1000 + ln 2`);
    /// a row of `-inf` gives `-inf`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1000.0f32, 1000.0], &[2]);
    /// let y = x.try_logsumexp(0, false)?.to_ndarray::<f32>()?;
    /// assert!((y[[]] - (1000.0 + std::f32::consts::LN_2)).abs() < 1e-3);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `logsumexp` when `axis` is out of
    /// range or has size 0.
    pub fn try_logsumexp(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis("logsumexp", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.logsumexp(axis, keepdim)));
        }
        let lse = || -> Result<Tensor> {
            let x = self.float();
            let m = x.finite_shift(axis)?;
            let s = x.try_sub(&m)?.exp_exact().row_sum(axis, true)?.ln_exact().try_add(&m)?;
            if keepdim {
                return Ok(s);
            }
            let mut shape = self.shape().to_vec();
            shape.remove(a);
            s.try_reshape(&shape)
        };
        lse().map_err(|e| e.in_op("logsumexp"))
    }
    /// [`Tensor::try_logsumexp`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range or of size 0 (the error [`Tensor::try_logsumexp`] returns).
    #[track_caller]
    pub fn logsumexp(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_logsumexp(axis, keepdim))
    }

    /// `log(softmax(x))` along `axis`, in the max-subtracted form `(x - m) - log(sum(exp(x - m)))`
    /// (never `log` of an underflowed 0 where the value is representable); a row holding
    /// `+inf` is all NaN, as in torch.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, -200.0], &[2]);
    /// let y = x.try_log_softmax(0)?.to_ndarray::<f32>()?;
    /// assert!(y[0].abs() < 1e-6 && (y[1] + 200.0).abs() < 1e-4);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `log_softmax` when `axis` is out of
    /// range or has size 0.
    pub fn try_log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.axis("log_softmax", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.log_softmax(axis)));
        }
        let lsm = || -> Result<Tensor> {
            let x = self.float();
            let shifted = x.try_sub(&x.finite_shift(axis)?)?;
            let lsm = shifted.try_sub(&shifted.exp_exact().row_sum(axis, true)?.ln_exact())?;
            x.nan_where_max_is_inf(axis, &lsm)
        };
        lsm().map_err(|e| e.in_op("log_softmax"))
    }
    /// [`Tensor::try_log_softmax`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range or of size 0 (the error [`Tensor::try_log_softmax`] returns).
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        ok(self.try_log_softmax(axis))
    }

    /// Cross-entropy of logits `(N, C)` against class indices, averaged over the `N` rows
    /// (torch's `cross_entropy` with the default mean reduction): `-mean_i log_softmax(x)[i, t_i]`.
    /// Logits `(.., C)` of more axes count every leading position as a row, in row-major order.
    ///
    /// The targets are a host slice of `N` class indices rather than a tensor, because they
    /// are data the caller has, and checking them here (each below `C`) turns an index out of
    /// range into an error at this call instead of a silently wrong loss. The loss is
    /// `(m_i - x[i, t_i]) + log(sum_j exp(x[i, j] - m_i))` per row with `m_i` the row maximum,
    /// averaged: both terms are exact where their difference is small, so large logits lose
    /// nothing (`logsumexp - x[t]` would round each to the logits' magnitude first), and a row
    /// with a `+inf` logit gives NaN, as in torch. The target logits are read by a small
    /// kernel of `N` loads, and their gradient is the one-hot of the targets computed where
    /// the gradient kernel reads it (an index compared with the `N` targets, never stored),
    /// so the gradient `(softmax - one_hot) / N` is one elementwise pass.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let logits = Tensor::from_vec(vec![2.0f64, 0.0, 0.0, 1.0], &[2, 2]);
    /// let loss = logits.try_cross_entropy(&[0, 1])?.to_ndarray::<f64>()?[[]];
    /// let expect = ((1.0 + (-2.0f64).exp()).ln() + (1.0 + (-1.0f64).exp()).ln()) / 2.0;
    /// assert!((loss - expect).abs() < 1e-15);
    /// assert!(logits.try_cross_entropy(&[0, 2]).is_err()); // class 2 of 2
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `cross_entropy` when the logits are
    /// not at least 2-D with at least one class, `targets` does not have one index per row, or an index
    /// is not below the number of classes.
    pub fn try_cross_entropy(&self, targets: &[usize]) -> Result<Tensor> {
        if let [lead @ .., c] = self.shape()
            && lead.len() > 1
        {
            // (.., C): every leading position is a row.
            let rows =
                self.try_reshape(&[lead.iter().product(), *c]).map_err(|e| e.in_op("cross_entropy"))?;
            return rows.try_cross_entropy(targets);
        }
        let &[n, c] = self.shape() else {
            return Err(shape_err(
                "cross_entropy",
                format!("logits must be (.., C), not {:?}", self.shape()),
            ));
        };
        if c == 0 {
            return Err(shape_err("cross_entropy", "logits have no classes (C = 0)"));
        }
        if targets.len() != n {
            return Err(shape_err(
                "cross_entropy",
                format!("targets has {} indices for {n} rows of logits", targets.len()),
            ));
        }
        if let Some((row, &t)) = targets.iter().enumerate().find(|&(_, &t)| t >= c) {
            return Err(shape_err("cross_entropy", format!("targets[{row}] = {t} is not below C = {c}")));
        }
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| ok(x.try_cross_entropy(targets))));
        }
        let ce = || -> Result<Tensor> {
            let x = self.float();
            let t = Tensor::from_vec(targets.iter().map(|&t| t as i64).collect::<Vec<_>>(), &[n, 1]);
            // `-log_softmax(x)[i, t_i] = (m_i - x[i, t_i]) + log(sum(exp(x_i - m_i)))`: the
            // logits are read for the row maximum and the sum, and `n` of them for the picks.
            let m = x.finite_shift(-1)?;
            let lse = x.try_sub(&m)?.exp_exact().row_sum(-1, true)?.ln_exact();
            let loss =
                x.nan_where_max_is_inf(-1, &m.try_sub(&x.pick(&t)?.try_reshape(&[n, 1])?)?.try_add(&lse)?)?;
            let loss = loss.try_reshape(&[n])?;
            // Its own kernel, so its rows are the THREAD axis, before the mean over them.
            let staged = Tensor::from_uop(UOp::new(Op::Stage, loss.dtype(), vec![loss.uop().clone()]));
            staged.try_mean(0, false)
        };
        ce().map_err(|e| e.in_op("cross_entropy"))
    }
    /// [`Tensor::try_cross_entropy`], panicking where it returns an error.
    ///
    /// # Panics
    ///
    /// On the errors [`Tensor::try_cross_entropy`] returns.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &[usize]) -> Tensor {
        ok(self.try_cross_entropy(targets))
    }

    /// [`Tensor::try_cross_entropy`] with the class indices in an i64 or i32 tensor of the
    /// logits' leading shape (torch's `cross_entropy(logits, targets)`), read on the host.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let logits = Tensor::randn(&[2, 3, 5], 7); // (batch, tokens, classes)
    /// let targets = Tensor::from_vec(vec![0i64, 4, 2, 1, 1, 3], &[2, 3]);
    /// let by_tensor = logits.try_cross_entropy_tensor(&targets)?.item()?;
    /// let by_slice = logits.try_cross_entropy(&[0, 4, 2, 1, 1, 3])?.item()?;
    /// assert_eq!(by_tensor, by_slice);
    /// assert!(logits.try_cross_entropy_tensor(&Tensor::from_vec(vec![0i64; 5], &[5])).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Tensor::try_cross_entropy`]; [`TensorError::Shape`](crate::TensorError::Shape)
    /// naming `cross_entropy` when the targets' shape is not the logits' without the class
    /// axis or an index is negative, [`TensorError::DType`](crate::TensorError::DType) when
    /// the targets are not i64 or i32.
    pub fn try_cross_entropy_tensor(&self, targets: &Tensor) -> Result<Tensor> {
        let lead = &self.shape()[..self.ndim().saturating_sub(1)];
        if targets.shape() != lead {
            return Err(shape_err(
                "cross_entropy",
                format!(
                    "targets {:?} must be the logits' {:?} without the class axis",
                    targets.shape(),
                    self.shape()
                ),
            ));
        }
        let values: Vec<i64> = match targets.dtype() {
            DType::I64 | DType::I32 => {
                targets.cast(DType::I64).to_ndarray::<i64>()?.iter().copied().collect()
            }
            other => {
                return Err(TensorError::DType {
                    op: "cross_entropy",
                    msg: format!("targets are {other}; class indices are i64 or i32"),
                });
            }
        };
        let indices = (values.iter().enumerate())
            .map(|(i, &t)| {
                usize::try_from(t)
                    .map_err(|_| shape_err("cross_entropy", format!("targets[{i}] = {t} is negative")))
            })
            .collect::<Result<Vec<usize>>>()?;
        self.try_cross_entropy(&indices)
    }

    /// `self[i, t[i]]` for logits `(n, c)` and `t`, an `(n, 1)` i64 tensor of indices already
    /// checked to be below `c`, as a kernel of `n` loads whose gradient is the one-hot
    /// [`PICK_VJP`] builds.
    fn pick(&self, t: &Tensor) -> Result<Tensor> {
        let (n, c) = (self.shape()[0], self.shape()[1]);
        let node = Tensor::try_custom(
            "pick",
            pick_program(n, c, self.dtype()),
            &[self, t],
            &[n],
            self.dtype(),
            None,
        )?;
        let Op::Custom(kernel) = node.uop().op() else { unreachable!("try_custom builds a custom node") };
        let kernel = CustomKernel { vjp: Some(PICK_VJP.clone()), ..kernel.clone() };
        Ok(Tensor::from_uop(UOp::new(Op::Custom(kernel), node.dtype(), node.uop().src().to_vec())))
    }

    /// Layer normalization over the last axis (torch's `layer_norm` with
    /// `normalized_shape = [last]`): `(x - mean) / sqrt(var + eps)` with the population
    /// variance, then `* weight` and `+ bias` when given (each of shape `[last]`). A row whose
    /// variance overflows to infinity is NaN, as in torch.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f64, 3.0], &[1, 2]);
    /// let w = Tensor::from_vec(vec![2.0f64, 2.0], &[2]);
    /// let y = x.try_layer_norm(Some(&w), None, 0.0)?.to_ndarray::<f64>()?;
    /// assert_eq!(y.as_slice(), Some(&[-2.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `layer_norm` when `self` is 0-d, or
    /// `weight` or `bias` is not of shape `[last]` (the message names which).
    pub fn try_layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let Some(&last) = self.shape().last() else {
            return Err(shape_err("layer_norm", "input is 0-d; it needs an axis to normalize"));
        };
        for (name, p) in [("weight", weight), ("bias", bias)] {
            if let Some(p) = p
                && p.shape() != [last]
            {
                return Err(shape_err(
                    "layer_norm",
                    format!("{name} has shape {:?}, not [{last}] (the input's last axis)", p.shape()),
                ));
            }
        }
        let ln = || -> Result<Tensor> {
            let half = self.dtype().is_half();
            let x = if half { self.cast(DType::F32) } else { self.float() };
            let centered = x.try_sub(&x.try_mean(-1, true)?)?;
            let var = (&centered * &centered).try_mean(-1, true)?;
            // An overflowed (or NaN) variance leaves nothing to normalize by: the row is NaN, as
            // torch's is, rather than the zeros `1 / sqrt(inf) = 0` would make of it.
            let rstd = var.add_lit(eps).sqrt().recip();
            let rstd = var.try_lt(&var.lit(f64::INFINITY))?.try_where(&rstd, &var.lit(f64::NAN))?;
            let mut y = centered.try_mul(&rstd)?;
            let widen = |p: &Tensor| if half { p.cast(DType::F32) } else { p.clone() };
            if let Some(w) = weight {
                y = y.try_mul(&widen(w))?;
            }
            if let Some(b) = bias {
                y = y.try_add(&widen(b))?;
            }
            Ok(if half { y.cast(self.dtype()) } else { y })
        };
        ln().map_err(|e| e.in_op("layer_norm"))
    }
    /// [`Tensor::try_layer_norm`], panicking where it returns an error.
    ///
    /// # Panics
    ///
    /// On the errors [`Tensor::try_layer_norm`] returns.
    #[track_caller]
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Tensor {
        ok(self.try_layer_norm(weight, bias, eps))
    }
}
