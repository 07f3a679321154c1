//! The std operators (`+ - * /`, unary `-`) on tensors, and on a tensor and a host
//! [`Scalar`]; they panic where the `try_` methods return an error, at the caller's location.
//! The scalar becomes a constant of the dtype the operation computes in (the rule is on
//! [`Scalar`]): the tensor's own for a float tensor, so `x * 0.1` on an f64 tensor is f64
//! arithmetic. `x / v` multiplies by `1 / v` computed in f64 and rounded once to that dtype
//! (one rounding more than a true division; exact when `v` is a power of two), and is a true
//! (float) division on integer tensors.

use super::scalar::{Scalar, ScalarOperand, sealed::Sealed};
use super::{Tensor, ok};
use std::ops;
use uopc_ir::{BinaryOp, ConstValue};

macro_rules! tensor_binop {
    ($trait:ident, $method:ident, $try:ident, $op:expr, $rev:expr) => {
        impl ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                ok(self.$try(rhs))
            }
        }
        impl ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                ok(self.$try(&rhs))
            }
        }
        impl ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                ok(self.$try(rhs))
            }
        }
        impl ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                ok(self.$try(&rhs))
            }
        }
        impl<S: Scalar> ops::$trait<S> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: S) -> Tensor {
                $op(self, rhs.operand())
            }
        }
        impl<S: Scalar> ops::$trait<S> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: S) -> Tensor {
                $op(&self, rhs.operand())
            }
        }
        impl ops::$trait<&Tensor> for f64 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                $rev(self.operand(), rhs)
            }
        }
        impl ops::$trait<Tensor> for f64 {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                $rev(self.operand(), &rhs)
            }
        }
        impl ops::$trait<&Tensor> for i64 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                $rev(self.operand(), rhs)
            }
        }
        impl ops::$trait<Tensor> for i64 {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                $rev(self.operand(), &rhs)
            }
        }
    };
}

/// `t op v` (or `v op t` when `reversed`) in the dtype the pair computes in.
fn scalar_arith(t: &Tensor, op: BinaryOp, v: ScalarOperand, reversed: bool) -> Tensor {
    v.operand_tensor(t).scalar_op(op, v.value, reversed)
}

/// `t / v`: true division, so integer tensors divide as floats.
fn scalar_div(t: &Tensor, v: ScalarOperand) -> Tensor {
    t.float().scalar_op(BinaryOp::Mul, ConstValue::float(1.0 / v.as_f64()), false)
}

/// `v / t`.
fn scalar_rdiv(v: ScalarOperand, t: &Tensor) -> Tensor {
    t.float().recip().scalar_op(BinaryOp::Mul, v.value, false)
}

tensor_binop!(
    Add,
    add,
    try_add,
    |t: &Tensor, v| scalar_arith(t, BinaryOp::Add, v, false),
    |v, t: &Tensor| scalar_arith(t, BinaryOp::Add, v, true)
);
tensor_binop!(
    Sub,
    sub,
    try_sub,
    |t: &Tensor, v| scalar_arith(t, BinaryOp::Sub, v, false),
    |v, t: &Tensor| scalar_arith(t, BinaryOp::Sub, v, true)
);
tensor_binop!(
    Mul,
    mul,
    try_mul,
    |t: &Tensor, v| scalar_arith(t, BinaryOp::Mul, v, false),
    |v, t: &Tensor| scalar_arith(t, BinaryOp::Mul, v, true)
);
tensor_binop!(Div, div, try_div, scalar_div, scalar_rdiv);

impl ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}
impl ops::Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}
