//! Realizing a tensor and reading its elements back, to and from ndarray.

use super::{Element, Tensor};
use crate::error::{Result, TensorError};
use crate::options::RealizeOptions;
use crate::realize::realize;
use crate::report::RealizeReport;
use ndarray::{ArrayD, Dimension, IxDyn};
use uopc_ir::{HostBuffer, Op};

impl Tensor {
    /// Computes this tensor with default options; the result is backed by host data.
    pub fn realize(&self) -> Result<Tensor> {
        Ok(self.realize_with(&RealizeOptions::default())?.0)
    }

    /// Computes this tensor with `opts`, returning the report too.
    pub fn realize_with(&self, opts: &RealizeOptions) -> Result<(Tensor, RealizeReport)> {
        let (mut ts, report) = realize(&[self], opts)?;
        Ok((ts.remove(0), report))
    }

    /// The elements as an ndarray of `E` (realizing with default options, converting dtype).
    pub fn to_ndarray<E: Element>(&self) -> Result<ArrayD<E>> {
        self.to_ndarray_with(&RealizeOptions::default())
    }

    /// [`Tensor::to_ndarray`] with explicit realize options.
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

impl<E: Element, D: Dimension> From<ndarray::Array<E, D>> for Tensor {
    #[track_caller]
    fn from(a: ndarray::Array<E, D>) -> Tensor {
        Tensor::from_array(&a)
    }
}
