//! Index-built tensors: `arange`, one-hot rows from class indices, and row selection
//! (`index_select` along the first axis, an embedding lookup), all from indices held on the
//! host.

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
        Tensor { uop: uopc_ir::UOp::new(uopc_ir::Op::Arange(n), DType::I64, vec![]) }
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
    /// below `classes` (the message names its position).
    pub fn try_one_hot(indices: &[usize], classes: usize) -> Result<Tensor> {
        let mut rows = vec![0.0f32; indices.len() * classes];
        for (row, &c) in indices.iter().enumerate() {
            if c >= classes {
                return Err(shape_err(
                    "one_hot",
                    format!("indices[{row}] = {c} is not below {classes} classes"),
                ));
            }
            rows[row * classes + c] = 1.0;
        }
        Tensor::try_from_vec(rows, &[indices.len(), classes])
    }

    /// Rows `indices` of this tensor along its first axis, in order (repeats allowed): shape
    /// `[indices.len(), ..rest]`. Computed as a one-hot matrix times the rows, which is exact
    /// (each output is one product by 1 plus zeros) and gives the rows their gradient through
    /// `matmul` (an embedding lookup).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let table = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    /// let picked = table.try_index_select(&[2, 2, 0])?;
    /// assert_eq!(picked.to_ndarray::<f32>()?.as_slice(), Some(&[5.0, 6.0, 5.0, 6.0, 1.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `index_select` when this tensor is
    /// 0-d, not a float tensor, or an index is not below its first axis.
    pub fn try_index_select(&self, indices: &[usize]) -> Result<Tensor> {
        let shape = self.shape().to_vec();
        let Some(&rows) = shape.first() else {
            return Err(shape_err("index_select", "the tensor is 0-d; it has no rows to select"));
        };
        let d = self.dtype();
        if !(d.is_float() || d.is_half()) {
            return Err(shape_err(
                "index_select",
                format!("rows of a {d:?} tensor; it needs a float tensor"),
            ));
        }
        if let Some((at, &i)) = indices.iter().enumerate().find(|&(_, &i)| i >= rows) {
            return Err(shape_err("index_select", format!("indices[{at}] = {i} is not below {rows} rows")));
        }
        let rest: Vec<usize> = shape[1..].to_vec();
        let width: usize = rest.iter().product();
        let one_hot = Tensor::try_one_hot(indices, rows)?;
        let one_hot = if d == DType::F32 { one_hot } else { one_hot.cast(d) };
        let picked = one_hot.try_matmul(&self.try_reshape(&[rows, width])?)?;
        let out: Vec<usize> = std::iter::once(indices.len()).chain(rest).collect();
        picked.try_reshape(&out)
    }
}
