//! Values whose gradient is given by a rule rather than by differentiating how they are
//! computed.

use super::Tensor;
use crate::error::{Result, TensorError};
use std::sync::Arc;
use uopc_ir::{DataRef, Op, UOp};

/// A gradient rule: given the tensor differentiated with respect to (`wrt`) and the
/// cotangent of the value, the cotangent of `wrt` (of `wrt`'s shape, or one that broadcasts
/// to it). It is built from ordinary tensor ops, so it has gradients of its own.
pub type GradientRule = dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync;

impl Tensor {
    /// `self`'s value, whose gradient with respect to `wrt` is `rule(wrt, cotangent)` instead
    /// of the derivative of the ops that compute `self` (no gradient flows through those).
    ///
    /// For composite functions with a closed-form derivative: a truncated series, say, whose
    /// term-by-term derivative would cost as much as many evaluations. The node changes
    /// nothing in the forward computation (it is dropped before kernelizing), and gradients
    /// of any order are those of `rule`'s ops.
    ///
    /// ```rust
    /// use std::sync::Arc;
    /// use uopc_tensor::{GradientRule, Tensor, gradient};
    /// let x = Tensor::from_vec(vec![0.5f64, 2.0], &[2]);
    /// // x^3 computed as a product, its derivative declared as 3 x^2.
    /// let rule: Arc<GradientRule> = Arc::new(|x: &Tensor, g: &Tensor| Ok(&(x * x) * &(g * 3.0)));
    /// let cube = (&(&x * &x) * &x).try_with_gradient_rule(&x, rule)?;
    /// let [dx] = &gradient(&cube.sum(0, false), &[&x])?[..] else { unreachable!() };
    /// assert_eq!(dx.to_ndarray::<f64>()?.as_slice(), Some(&[0.75, 12.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DType`] naming `with_gradient_rule` when `self` or `wrt` is not a float
    /// tensor.
    pub fn try_with_gradient_rule(&self, wrt: &Tensor, rule: Arc<GradientRule>) -> Result<Tensor> {
        for (what, t) in [("value", self), ("wrt", wrt)] {
            if !(t.dtype().is_float() || t.dtype().is_half()) {
                return Err(TensorError::DType {
                    op: "with_gradient_rule",
                    msg: format!("{what} is {}, not a float tensor", t.dtype()),
                });
            }
        }
        let op = Op::GradientRule(DataRef(Arc::new(rule)));
        Ok(Tensor::from_uop(UOp::new(op, self.dtype(), vec![self.uop().clone(), wrt.uop().clone()])))
    }
}

/// The rule a GRADIENT_RULE node holds.
pub(crate) fn gradient_rule(data: &DataRef) -> Option<&Arc<GradientRule>> {
    data.0.downcast_ref::<Arc<GradientRule>>()
}
