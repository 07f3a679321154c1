//! Host scalars as operands of tensor arithmetic (`&x * 0.1`, `&x + 1`): the [`Scalar`] trait
//! and the dtype rule that decides what a tensor-scalar operation computes in.

use super::Tensor;
use uopc_ir::{ConstValue, DType};

/// A host number usable as the scalar operand of the std operators on tensors (`f32`, `f64`,
/// `i32`, `i64`), as ndarray's `ScalarOperand` is.
///
/// The scalar takes the tensor's dtype, as torch treats a Python number: on an f64 tensor
/// `x * 0.1` multiplies by the f64 nearest 0.1, on an f32 tensor by that value rounded once
/// to f32, and on an integer tensor an integer scalar keeps the integer dtype (`i32 tensor +
/// 1` is i32) while a float scalar makes the result f32 (`+ 2.5` never truncates the scalar).
/// A bool tensor with an integer scalar computes in the scalar's integer type.
///
/// An unsuffixed float literal is an `f64` here (`x + 1.0` needs no suffix), and an integer
/// literal an `i32` on the right of the operator. On the left of an operator only `f64` and
/// `i64` are accepted (`0.5 * &x`, `1 - &x`): a Rust impl for every scalar type would leave a
/// literal there with several types to choose from, and `(1.0 - &x).exp()` would not compile.
///
/// The trait is sealed: the conversion to a constant is private to this crate, so that what
/// a scalar means stays one rule.
///
/// ```rust
/// use uopc_tensor::Tensor;
/// let x = Tensor::from_vec(vec![3.0f64], &[1]);
/// assert_eq!((&x * 0.1).to_ndarray::<f64>()?[0], 3.0 * 0.1); // f64 arithmetic, exactly
/// let n = Tensor::from_vec(vec![3i32], &[1]);
/// assert_eq!((&n + 1).dtype(), uopc_ir::DType::I32);
/// assert_eq!((&n + 2.5).to_ndarray::<f32>()?[0], 5.5);
/// assert_eq!((1.0 - &x).exp().to_ndarray::<f64>()?[0], (-2.0f64).exp());
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
pub trait Scalar: Copy + Send + Sync + 'static + sealed::Sealed {}

pub(crate) mod sealed {
    /// The constant a scalar stands for; implemented only in this crate (see [`super::Scalar`]).
    pub trait Sealed {
        /// This scalar as an IR constant and the dtype it was written in.
        fn operand(self) -> super::ScalarOperand;
    }
}

/// A scalar operand as the IR holds it: its exact value and the Rust type it came from.
#[derive(Clone, Copy, Debug)]
pub struct ScalarOperand {
    /// The value, exact: integers as integers (an i64 beyond 2^53 survives), floats as f64s.
    pub(crate) value: ConstValue,
    /// The dtype of the Rust type it was written in (only whether it is an integer matters to
    /// promotion, and which integer for a bool tensor).
    pub(crate) dtype: DType,
}

macro_rules! scalar_impl {
    ($t:ty, $dtype:expr, $value:expr) => {
        impl Scalar for $t {}
        impl sealed::Sealed for $t {
            fn operand(self) -> ScalarOperand {
                ScalarOperand { value: $value(self), dtype: $dtype }
            }
        }
    };
}

scalar_impl!(f32, DType::F32, |v: f32| ConstValue::float(f64::from(v)));
scalar_impl!(f64, DType::F64, ConstValue::float);
scalar_impl!(i32, DType::I32, |v: i32| ConstValue::Int(i64::from(v)));
scalar_impl!(i64, DType::I64, ConstValue::Int);

impl ScalarOperand {
    /// The value as an f64 (an integer beyond 2^53 rounds), for reciprocals.
    pub(crate) fn as_f64(self) -> f64 {
        self.value.as_f64()
    }

    /// The tensor that `tensor op scalar` computes in, converted: float tensors (16-bit ones
    /// included) as they are, integer tensors as they are with an integer scalar, a bool
    /// tensor in the integer scalar's dtype, and every other pair in f32 (torch's default
    /// float for an integer tensor with a float number).
    pub(crate) fn operand_tensor(self, tensor: &Tensor) -> Tensor {
        let d = tensor.dtype();
        match (d, self.dtype.is_int()) {
            (d, true) if d.is_int() => tensor.clone(),
            (DType::Bool, true) => tensor.cast(self.dtype),
            _ => tensor.float(),
        }
    }
}
