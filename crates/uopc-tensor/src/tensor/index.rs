//! Index-built tensors: `arange`, one-hot rows from class indices, row selection by host
//! indices (`index_select_rows`, an embedding lookup on tile GEMMs), and selection by a tensor
//! of indices (`index_select`, `gather`, in the `gather` module).

use super::Tensor;
use crate::error::{Result, shape_err};
use uopc_ir::DType;

impl Tensor {
    /// `0, 1, .., n - 1` as an i64 tensor of shape `[n]` (numpy's and torch's integer
    /// `arange`); cast it for a float range. Lazy: kernels compute each position from their
    /// loop index rather than reading it, so masks built by comparing positions (see
    /// [`masked::causal_mask`](crate::masked::causal_mask)) let the compiler see which blocks
    /// they hide.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let r = Tensor::arange(4).cast(uopc_ir::DType::F32) * 0.5f32;
    /// assert_eq!(r.to_ndarray::<f32>()?.as_slice(), Some(&[0.0, 0.5, 1.0, 1.5][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn arange(n: usize) -> Tensor {
        Tensor { uop: uopc_ir::UOp::new(uopc_ir::Op::Arange(n), uopc_ir::DType::I64, vec![]) }
    }

    /// One f32 row per index, 1 at the index's class and 0 elsewhere: shape `[indices.len(),
    /// classes]`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let h = Tensor::try_one_hot(&[2, 0], 3)?;
    /// assert_eq!(h.to_ndarray::<f32>()?.as_slice(), Some(&[0.0, 0.0, 1.0, 1.0, 0.0, 0.0][..]));
    /// assert!(Tensor::try_one_hot(&[3], 3).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `one_hot` when an index is not
    /// below `classes` (the message names its position), or `[indices.len(), classes]` has more
    /// than 2^40 elements (or `classes` is over 2^40).
    pub fn try_one_hot(indices: &[usize], classes: usize) -> Result<Tensor> {
        let shape = [indices.len(), classes];
        super::check_size("one_hot", &shape)?;
        if let Some((row, &c)) = indices.iter().enumerate().find(|&(_, &c)| c >= classes) {
            return Err(shape_err("one_hot", format!("indices[{row}] = {c} is not below {classes} classes")));
        }
        if indices.is_empty() || classes == 0 {
            return Ok(Tensor::empty(&shape, DType::F32));
        }
        // A comparison of the class index with each row's index, computed where it is read:
        // a one-hot of many classes costs no memory until it is realized.
        let targets = indices.iter().map(|&c| c as i64).collect::<Vec<_>>();
        let targets = Tensor::try_from_vec(targets, &[indices.len(), 1])?;
        let hot = Tensor::arange(classes).try_reshape(&[1, classes])?.try_eq(&targets)?;
        Ok(hot.cast(DType::F32))
    }

    /// Rows `indices` (host indices) of this tensor along its first axis, in order (repeats
    /// allowed): shape `[indices.len(), ..rest]`, any dtype. This is
    /// [`Tensor::try_index_select`] along axis 0 with the indices as an i64 tensor: a copy of
    /// the rows (exact), whose gradient is the scatter-add of the cotangent's rows (an
    /// embedding lookup).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let table = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    /// let picked = table.try_index_select_rows(&[2, 2, 0])?;
    /// assert_eq!(picked.to_ndarray::<f32>()?.as_slice(), Some(&[5.0, 6.0, 5.0, 6.0, 1.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `index_select_rows` when this
    /// tensor is 0-d or an index is not below its first axis.
    pub fn try_index_select_rows(&self, indices: &[usize]) -> Result<Tensor> {
        let op = "index_select_rows";
        let Some(&rows) = self.shape().first() else {
            return Err(shape_err(op, "the tensor is 0-d; it has no rows to select"));
        };
        if let Some((at, &i)) = indices.iter().enumerate().find(|&(_, &i)| i >= rows) {
            return Err(shape_err(op, format!("indices[{at}] = {i} is not below {rows} rows")));
        }
        // Below `rows <= 2^40` (the element cap), so each index fits an i64.
        let as_i64: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let tensor = Tensor::try_from_vec(as_i64, &[indices.len()])?;
        self.try_index_select(0, &tensor).map_err(|e| e.in_op(op))
    }
}
