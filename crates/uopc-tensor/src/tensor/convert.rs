//! Realizing a tensor and reading its elements back, to and from ndarray.
//!
//! Copies: [`Tensor::from_array`] copies the elements once (a borrowed array cannot be kept);
//! `Tensor::try_from(array)` takes an owned array's buffer without copying when the array is
//! in standard (row-major) layout and copies once otherwise; [`Tensor::to_ndarray`]
//! copies once, because the tensor's buffer may be shared by other tensors of the graph.

use super::{Element, Tensor};
use crate::error::{Result, TensorError};
use crate::options::RealizeOptions;
use crate::realize::realize;
use crate::report::RealizeReport;
use ndarray::{Array, ArrayBase, ArrayD, Dimension, IxDyn};
use uopc_ir::{HostBuffer, Op};

impl Tensor {
    /// A tensor with a copy of an ndarray's elements (any layout, logical order).
    ///
    /// ```rust
    /// use uopc_tensor::{Tensor, ndarray};
    /// let a = ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]);
    /// let t = Tensor::try_from_array(&a.t())?; // a transposed view, read in logical order
    /// assert_eq!(t.to_ndarray::<f32>()?, a.t().to_owned().into_dyn());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`TensorError::Shape`] naming `from_array` when the array has more than 2^40 elements.
    pub fn try_from_array<E: Element, S: ndarray::Data<Elem = E>, D: Dimension>(
        a: &ArrayBase<S, D>,
    ) -> Result<Tensor> {
        // a standard-layout array is one memcpy; any other layout is gathered in logical order
        let data = match a.as_slice() {
            Some(slice) => slice.to_vec(),
            None => a.iter().copied().collect(),
        };
        Tensor::try_from_vec(data, a.shape()).map_err(|e| e.in_op("from_array"))
    }

    /// [`Tensor::try_from_array`], panicking where it returns an error.
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements.
    #[track_caller]
    pub fn from_array<E: Element, S: ndarray::Data<Elem = E>, D: Dimension>(a: &ArrayBase<S, D>) -> Tensor {
        super::ok(Tensor::try_from_array(a))
    }

    /// Computes this tensor with default options; the result is backed by host data.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]).relu();
    /// assert!(!y.is_realized());
    /// let y = y.realize()?;
    /// assert!(y.is_realized());
    /// assert_eq!(y.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 0.0, 3.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Ir`] or [`TensorError::Backend`] when a kernel fails to compile or run
    /// (a compiler bug, reported rather than hidden), [`TensorError::Unsupported`] when the
    /// plan's buffers cannot fit in memory.
    pub fn realize(&self) -> Result<Tensor> {
        Ok(self.realize_with(&RealizeOptions::default())?.0)
    }

    /// Computes this tensor with `opts`, returning the report too.
    ///
    /// ```rust
    /// use uopc_tensor::{RealizeOptions, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32; 8], &[2, 4]);
    /// let (_, report) = x.softmax(-1).realize_with(&RealizeOptions::fused())?;
    /// assert_eq!(report.kernels.len(), 1); // the row max and sum are recomputed, not stored
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Tensor::realize`].
    pub fn realize_with(&self, opts: &RealizeOptions) -> Result<(Tensor, RealizeReport)> {
        let (mut ts, report) = realize(&[self], opts)?;
        Ok((ts.remove(0), report))
    }

    /// The elements as an ndarray of `E` (realizing with default options, converting dtype).
    /// The elements are copied once: the tensor's buffer stays with the tensor, which other
    /// tensors of the graph may share.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let sums = x.sum(1, false).to_ndarray::<f64>()?;
    /// assert_eq!(sums, uopc_tensor::ndarray::arr1(&[3.0, 7.0]).into_dyn());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Tensor::realize`].
    pub fn to_ndarray<E: Element>(&self) -> Result<ArrayD<E>> {
        self.to_ndarray_with(&RealizeOptions::default())
    }

    /// [`Tensor::to_ndarray`] with explicit realize options.
    ///
    /// # Errors
    ///
    /// As [`Tensor::realize`].
    pub fn to_ndarray_with<E: Element>(&self, opts: &RealizeOptions) -> Result<ArrayD<E>> {
        let t = if self.dtype() == E::DTYPE { self.clone() } else { self.cast(E::DTYPE) };
        let t = if matches!(t.uop.op(), Op::Data { .. }) { t } else { t.realize_with(opts)?.0 };
        let Op::Data { data, shape } = t.uop.op() else { unreachable!("realize returns data") };
        let host = data.0.downcast_ref::<HostBuffer>().expect("tensor data is a HostBuffer");
        let v = E::from_host(host).ok_or_else(|| TensorError::DType {
            op: "to_ndarray",
            msg: format!("data is {}", host.dtype()),
        })?;
        Ok(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).expect("length matches shape"))
    }
}

/// An owned array becomes a tensor without a copy when it is in standard layout (its buffer is
/// moved into the tensor), with one copy otherwise.
///
/// ```rust
/// use uopc_tensor::{Tensor, ndarray::Array2};
/// let t = Tensor::try_from(Array2::<f32>::ones((2, 3)))?;
/// assert_eq!(t.shape(), [2, 3]);
/// assert_eq!(Tensor::try_from(Array2::<f32>::ones((0, 3)))?.shape(), [0, 3]); // empty is fine
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
impl<E: Element, D: Dimension> TryFrom<Array<E, D>> for Tensor {
    type Error = TensorError;

    fn try_from(a: Array<E, D>) -> Result<Tensor> {
        if !a.is_standard_layout() {
            return Tensor::try_from_array(&a);
        }
        let shape = a.shape().to_vec();
        let n = crate::util::numel(&shape);
        // standard layout: the elements are the n contiguous ones from the offset on
        let (mut data, offset) = a.into_raw_vec_and_offset();
        let offset = offset.unwrap_or(0);
        if offset + n <= data.len() {
            data.truncate(offset + n);
            data.drain(..offset);
        }
        Tensor::try_from_vec(data, &shape).map_err(|e| e.in_op("from_array"))
    }
}
