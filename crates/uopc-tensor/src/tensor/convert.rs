//! Realizing a tensor and reading its elements back, to and from ndarray.
//!
//! Copies: [`Tensor::from_array`] copies the elements once (a borrowed array cannot be kept);
//! `Tensor::try_from(array)` takes an owned array's buffer without copying when the array is
//! in standard (row-major) layout and copies once otherwise; [`Tensor::to_ndarray`]
//! copies once, because the tensor's buffer may be shared by other tensors of the graph.

use super::{Element, Tensor};
use crate::error::{Result, TensorError};
use crate::options::RealizeOptions;
use crate::realize::{realize, realize_impl};
use crate::report::RealizeReport;
use ndarray::{Array, ArrayBase, ArrayD, DataMut, Dimension, IxDyn};
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
        // The shape checks keep every shape within ndarray's limits; should one slip through,
        // the caller gets an error naming the shape, not a panic.
        ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).map_err(|e| {
            crate::error::shape_err("to_ndarray", format!("shape {shape:?} does not fit an ndarray: {e}"))
        })
    }
}

impl Tensor {
    /// Computes this tensor into `out` (row-major, `numel` elements of the tensor's dtype).
    ///
    /// An f32 result whose plan ends in a kernel that writes the output buffer whole is
    /// computed straight into `out` (zeroed first, as the plan's own output buffers are, unless
    /// that kernel provably stores every element: [`crate::Plan::unzeroed_outputs`]),
    /// with no buffer of its own and no copy; any other result (other dtypes, an input
    /// returned as it is, a plan that reads its output back) is computed as by
    /// [`Tensor::realize`] and copied into `out` once.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3]);
    /// let mut out = [0.0f32; 3];
    /// (&x * 2.0).relu().realize_into(&mut out)?;
    /// assert_eq!(out, [2.0, 0.0, 6.0]);
    /// assert!(x.realize_into(&mut [0.0f32; 2]).is_err()); // 2 slots for 3 elements
    /// assert!(x.realize_into(&mut [0.0f64; 3]).is_err()); // f64 memory for an f32 tensor
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DType`] naming `realize_into` when `E` is not the tensor's dtype (cast
    /// the tensor first: a silent conversion would hide a second buffer),
    /// [`TensorError::Shape`] naming `realize_into` when `out` does not have exactly `numel`
    /// elements; otherwise as [`Tensor::realize`].
    pub fn realize_into<E: Element>(&self, out: &mut [E]) -> Result<()> {
        self.realize_into_with(out, &RealizeOptions::default()).map(|_| ())
    }

    /// [`Tensor::realize_into`] with explicit realize options, returning the report (whose
    /// `wrote_caller_buffer` says whether `out` was written by the kernel itself).
    ///
    /// # Errors
    ///
    /// As [`Tensor::realize_into`].
    pub fn realize_into_with<E: Element>(
        &self,
        out: &mut [E],
        opts: &RealizeOptions,
    ) -> Result<RealizeReport> {
        if E::DTYPE != self.dtype() {
            return Err(TensorError::DType {
                op: "realize_into",
                msg: format!("out holds {} but the tensor is {}", E::DTYPE, self.dtype()),
            });
        }
        if out.len() != self.numel() {
            return Err(TensorError::Shape {
                op: "realize_into",
                msg: format!(
                    "out has {} elements for a tensor of shape {:?} ({} elements)",
                    out.len(),
                    self.shape(),
                    self.numel()
                ),
            });
        }
        if self.numel() == 0 {
            return Ok(RealizeReport::default());
        }
        if !self.is_realized()
            && let Some(direct) = E::as_f32_mut(out)
        {
            let (result, mut report, wrote) = realize_impl(&[self], opts, Some(direct))?;
            if wrote {
                report.wrote_caller_buffer = true;
                return Ok(report);
            }
            copy_data(&result[0], out)?;
            return Ok(report);
        }
        let (result, report) = if self.is_realized() {
            (self.clone(), RealizeReport::default())
        } else {
            self.realize_with(opts)?
        };
        copy_data(&result, out)?;
        Ok(report)
    }

    /// Computes this tensor into an ndarray of the same shape, any layout: a standard-layout
    /// array is written as a slice by [`Tensor::realize_into`] (straight from the kernel when
    /// it can be), any other (a transposed or strided view) gets the elements copied in
    /// logical order.
    ///
    /// ```rust
    /// use uopc_tensor::{Tensor, ndarray::Array2};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    /// let mut out = Array2::<f32>::zeros((3, 2));
    /// x.realize_into_array(&mut out.view_mut().reversed_axes())?; // a transposed view
    /// assert_eq!(out, uopc_tensor::ndarray::arr2(&[[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]));
    /// assert!(x.realize_into_array(&mut out).is_err()); // (3, 2) for a (2, 3) tensor
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] naming `realize_into` when `out`'s shape is not the tensor's;
    /// otherwise as [`Tensor::realize_into`].
    pub fn realize_into_array<E: Element, S: DataMut<Elem = E>, D: Dimension>(
        &self,
        out: &mut ArrayBase<S, D>,
    ) -> Result<()> {
        if out.shape() != self.shape() {
            return Err(TensorError::Shape {
                op: "realize_into",
                msg: format!("out has shape {:?} for a tensor of shape {:?}", out.shape(), self.shape()),
            });
        }
        if let Some(slice) = out.as_slice_mut() {
            return self.realize_into(slice);
        }
        if E::DTYPE != self.dtype() {
            return Err(TensorError::DType {
                op: "realize_into",
                msg: format!("out holds {} but the tensor is {}", E::DTYPE, self.dtype()),
            });
        }
        let t = if self.is_realized() { self.clone() } else { self.realize()? };
        let data = host_elements::<E>(&t)?;
        out.iter_mut().zip(data).for_each(|(o, &v)| *o = v);
        Ok(())
    }
}

/// The elements of a data-backed tensor as `E`.
fn host_elements<E: Element>(t: &Tensor) -> Result<&[E]> {
    let host = t.host_data().expect("realized tensors are backed by data");
    E::from_host(host)
        .ok_or_else(|| TensorError::DType { op: "realize_into", msg: format!("data is {}", host.dtype()) })
}

/// Copies a data-backed tensor's elements into `out` (of the same length).
fn copy_data<E: Element>(t: &Tensor, out: &mut [E]) -> Result<()> {
    out.copy_from_slice(host_elements(t)?);
    Ok(())
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
