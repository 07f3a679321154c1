//! The std operators (`+ - * /`, unary `-`) on tensors and `f32` scalars; they panic where the
//! `try_` methods return an error, at the caller's location. The scalar (and, for `/`, its
//! reciprocal) becomes a constant of the tensor's own dtype, so `x / 3.0` on an f64 tensor
//! multiplies by the f64 1/3; a scalar that f32 cannot hold exactly (0.1) is rounded to f32
//! first, so exact f64 constants are f64 tensors (`Tensor::from_vec(vec![0.1f64], &[1])`). An integer tensor with an `f32`
//! scalar computes in f32, as torch promotes an integer tensor with a Python float (so
//! `x * 2.5` never truncates the scalar).

use super::{Tensor, ok};
use std::ops;
use uopc_ir::BinaryOp;

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
        impl ops::$trait<f32> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f32) -> Tensor {
                $op(self, f64::from(rhs))
            }
        }
        impl ops::$trait<f32> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f32) -> Tensor {
                $op(&self, f64::from(rhs))
            }
        }
        impl ops::$trait<&Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                $rev(f64::from(self), rhs)
            }
        }
        impl ops::$trait<Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                $rev(f64::from(self), &rhs)
            }
        }
    };
}

tensor_binop!(
    Add,
    add,
    try_add,
    |t: &Tensor, v| t.float().scalar_op(BinaryOp::Add, v, false),
    |v, t: &Tensor| t.float().scalar_op(BinaryOp::Add, v, true)
);
tensor_binop!(
    Sub,
    sub,
    try_sub,
    |t: &Tensor, v| t.float().scalar_op(BinaryOp::Sub, v, false),
    |v, t: &Tensor| t.float().scalar_op(BinaryOp::Sub, v, true)
);
tensor_binop!(
    Mul,
    mul,
    try_mul,
    |t: &Tensor, v| t.float().scalar_op(BinaryOp::Mul, v, false),
    |v, t: &Tensor| t.float().scalar_op(BinaryOp::Mul, v, true)
);
tensor_binop!(
    Div,
    div,
    try_div,
    |t: &Tensor, v: f64| t.float().scalar_op(BinaryOp::Mul, 1.0 / v, false),
    |v, t: &Tensor| t.float().recip().scalar_op(BinaryOp::Mul, v, false)
);

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
