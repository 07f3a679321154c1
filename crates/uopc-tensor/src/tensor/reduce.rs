//! Reductions along one axis, and the ops built from them: matmul and softmax.

use super::{LOG2E, Tensor, ok, promote};
use crate::error::{Result, shape_err};
use uopc_ir::{DType, Op, ReduceOp, UOp};

impl Tensor {
    fn try_reduce(&self, op: ReduceOp, axis: isize, keepdim: bool, name: &'static str) -> Result<Tensor> {
        let a = self.axis(name, axis)?;
        if self.dtype().is_half() {
            // Accumulated in f32, rounded once at the end.
            let r = self.cast(DType::F32).try_reduce(op, axis, keepdim, name)?;
            return Ok(r.cast(self.dtype()));
        }
        let n = self.ndim();
        let x = if self.dtype() == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        let x = if a == n - 1 {
            x
        } else {
            let perm: Vec<usize> = (0..n).filter(|&k| k != a).chain([a]).collect();
            x.try_permute(&perm)?
        };
        let d = x.dtype();
        let r = Tensor { uop: UOp::new(Op::Reduce { op, axes: 1 }, d, vec![x.uop]) };
        if keepdim {
            let mut shape = self.shape().to_vec();
            shape[a] = 1;
            r.try_reshape(&shape)
        } else {
            Ok(r)
        }
    }
    /// Sum over `axis` (negative counts from the end), keeping it as size 1 if `keepdim`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// assert_eq!(x.try_sum(0, false)?.to_ndarray::<f32>()?.as_slice(), Some(&[4.0, 6.0][..]));
    /// assert_eq!(x.try_sum(-1, true)?.shape(), [2, 1]);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `sum` when `axis` is out of range.
    pub fn try_sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(ReduceOp::Add, axis, keepdim, "sum")
    }
    /// [`Tensor::try_sum`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_sum`] returns).
    #[track_caller]
    pub fn sum(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_sum(axis, keepdim))
    }
    /// Maximum over `axis`, keeping it as size 1 if `keepdim`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 3.0, 4.0], &[2, 2]);
    /// assert_eq!(x.try_max(1, false)?.to_ndarray::<f32>()?.as_slice(), Some(&[7.0, 4.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `max` when `axis` is out of range.
    pub fn try_max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(ReduceOp::Max, axis, keepdim, "max")
    }
    /// [`Tensor::try_max`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_max`] returns).
    #[track_caller]
    pub fn max(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_max(axis, keepdim))
    }

    /// Matrix product of `(n, k)` and `(k, m)`, as broadcast-multiply-reduce: `(n, m, k)`
    /// products summed over the last, contiguous axis.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let id = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2]);
    /// assert_eq!(a.try_matmul(&id)?.to_ndarray::<f32>()?, a.to_ndarray::<f32>()?);
    /// assert!(a.try_matmul(&Tensor::full(&[3, 2], 1.0)).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `matmul` when the operands are not matrices
    /// with `self`'s columns equal to `other`'s rows, or when the `(n, m, k)` product has more than 2^40
    /// elements.
    pub fn try_matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.shape(), other.shape());
        if a.len() != 2 || b.len() != 2 || a[1] != b[0] {
            return Err(shape_err("matmul", format!("cannot multiply {a:?} by {b:?}")));
        }
        let (n, k, m) = (a[0], a[1], b[1]);
        let d = promote(self.dtype(), other.dtype());
        if d.is_half() {
            // Products and their sum in f32 (a bf16 product is exact in f32), rounded once.
            return Ok(self.cast(DType::F32).try_matmul(&other.cast(DType::F32))?.cast(d));
        }
        let product = || {
            let x = self.try_reshape(&[n, 1, k])?.try_expand(&[n, m, k])?;
            let y = other.try_transpose(0, 1)?.try_reshape(&[1, m, k])?.try_expand(&[n, m, k])?;
            x.try_mul(&y)?.try_sum(-1, false)
        };
        product().map_err(|e| e.in_op("matmul"))
    }
    /// [`Tensor::try_matmul`], panicking on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not multiply (the error [`Tensor::try_matmul`] returns).
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        ok(self.try_matmul(other))
    }

    /// Softmax along `axis`: max-subtracted, with `exp` as `exp2` and log2(e) folded in.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).try_softmax(-1)?;
    /// let rows = p.sum(-1, false).to_ndarray::<f32>()?;
    /// assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-6));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `softmax` when `axis` is out of range.
    pub fn try_softmax(&self, axis: isize) -> Result<Tensor> {
        self.axis("softmax", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.softmax(axis)));
        }
        let softmax = || {
            let x = self.float();
            let m = x.try_max(axis, true)?;
            let e = (x.try_sub(&m)? * LOG2E as f32).exp2();
            e.try_mul(&e.try_sum(axis, true)?.recip())
        };
        softmax().map_err(|e| e.in_op("softmax"))
    }
    /// [`Tensor::try_softmax`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_softmax`] returns).
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        ok(self.try_softmax(axis))
    }
}
