//! The position of the largest or smallest element along an axis, and reading a one-element
//! tensor as a host number.

use super::Tensor;
use crate::error::{Result, TensorError, shape_err};
use uopc_ir::DType;

impl Tensor {
    /// The index of the largest element along `axis` (negative counts from the end), as an
    /// i64 tensor (the dtype of [`Tensor::arange`] and of the indices
    /// [`Tensor::try_index_select`] and [`Tensor::try_gather`] take, as in torch), with `axis`
    /// removed or, if `keepdim`, kept as size 1. Ties give the first index; a NaN counts as
    /// larger than every number (the first NaN's index is returned), as torch does. Not
    /// differentiable (an index has no gradient).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, -2.0, 0.5, 3.0], &[2, 3]);
    /// assert_eq!(x.try_argmax(1, false)?.to_ndarray::<i64>()?.as_slice(), Some(&[1, 2][..]));
    /// assert_eq!(x.try_argmax(0, true)?.to_ndarray::<i64>()?.as_slice(), Some(&[0, 0, 0][..]));
    /// let nan = Tensor::from_vec(vec![1.0f32, f32::NAN, 9.0], &[3]);
    /// assert_eq!(nan.try_argmax(0, false)?.to_ndarray::<i64>()?[[]], 1);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `argmax` when `axis` is out of
    /// range or has size 0 (no element to point at).
    pub fn try_argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_extremum(axis, keepdim, false)
    }

    /// [`Tensor::try_argmax`], panicking on an invalid axis.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let logits = Tensor::from_vec(vec![0.1f32, 2.0, -1.0], &[1, 3]);
    /// assert_eq!(logits.argmax(-1, false).to_ndarray::<i64>()?.as_slice(), Some(&[1][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On an axis out of range or of size 0 (the error [`Tensor::try_argmax`] returns).
    #[track_caller]
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Tensor {
        super::ok(self.try_argmax(axis, keepdim))
    }

    /// The index of the smallest element along `axis`, as [`Tensor::try_argmax`] gives the
    /// largest's: an i64 tensor, the first index on ties, the first NaN's index when there is
    /// one.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![3i32, -5, 8, -5], &[4]);
    /// assert_eq!(x.try_argmin(0, false)?.to_ndarray::<i64>()?[[]], 1);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `argmin` when `axis` is out of
    /// range or has size 0.
    pub fn try_argmin(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_extremum(axis, keepdim, true)
    }

    /// [`Tensor::try_argmin`], panicking on an invalid axis.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, 1.0, 4.0, 3.0], &[2, 2]);
    /// assert_eq!(x.argmin(1, false).to_ndarray::<i64>()?.as_slice(), Some(&[1, 1][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On an axis out of range or of size 0 (the error [`Tensor::try_argmin`] returns).
    #[track_caller]
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Tensor {
        super::ok(self.try_argmin(axis, keepdim))
    }

    /// argmax (or argmin when `smallest`) along `axis`: each position that holds the extremum
    /// (or a NaN, which the max and min propagate, so a NaN is the extremum when there is one)
    /// keeps its index, every other position the axis length, and the minimum over the axis
    /// is the first such index. Built from existing ops, so it fuses with what it reads.
    fn arg_extremum(&self, axis: isize, keepdim: bool, smallest: bool) -> Result<Tensor> {
        let op = if smallest { "argmin" } else { "argmax" };
        let a = self.axis(op, axis)?;
        let n = self.shape()[a];
        if n == 0 {
            let msg = format!("axis {axis} of shape {:?} has size 0 (no element to point at)", self.shape());
            return Err(shape_err(op, msg));
        }
        // A bool's max is taken in f32; comparing it with the bools needs one dtype.
        let x = if self.dtype() == DType::Bool { self.cast(DType::I32) } else { self.clone() };
        let inner = || -> Result<Tensor> {
            let extremum = if smallest { x.try_min(axis, true)? } else { x.try_max(axis, true)? };
            let hit = x.try_eq(&extremum)?;
            let mut at = vec![1; x.ndim()];
            at[a] = n;
            let index = Tensor::arange(n).try_reshape(&at)?;
            let past = Tensor::try_full_dtype(&[], n as i64, DType::I64)?;
            let candidates = hit.try_where(&index, &past)?;
            // A NaN equals nothing, itself included: its own index, found by `x != x`.
            let candidates = if x.dtype().is_float() || x.dtype().is_half() {
                x.try_ne(&x)?.try_where(&index, &candidates)?
            } else {
                candidates
            };
            candidates.try_min(a as isize, keepdim)
        };
        inner().map_err(|e| e.in_op(op))
    }

    /// The value of a one-element tensor (any shape whose axes are all 1, a 0-d tensor
    /// included) as an f32, realizing it if needed. Other dtypes are converted as
    /// [`Tensor::cast`] converts them (an f64 or a large integer rounds to the nearest f32, a
    /// bool is 0 or 1); read the exact value with [`Tensor::to_ndarray`] of that dtype.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.5], &[3]);
    /// assert_eq!(x.sum(0, false).item()?, 6.5);
    /// assert_eq!(x.max(0, true).item()?, 3.5); // shape [1]
    /// let err = x.item().unwrap_err().to_string();
    /// assert_eq!(err, "item: the tensor has shape [3] (3 elements); item() reads a tensor of exactly one element");
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] naming `item` when the tensor does not hold exactly one element;
    /// the errors of [`Tensor::realize`].
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(shape_err(
                "item",
                format!(
                    "the tensor has shape {:?} ({} elements); item() reads a tensor of exactly one element",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        let values = self.to_ndarray::<f32>()?;
        values.first().copied().ok_or_else(|| TensorError::Unsupported("item: no element read back".into()))
    }
}
