//! Elementwise operations: casts, unary math, broadcasting binary ops, comparisons, `where`.

use super::{Tensor, broadcast_shape, ok, promote};
use crate::error::{Result, shape_err};
use uopc_ir::{BinaryOp, ConstValue, DType, Op, UOp, UnaryOp, const_of};

impl Tensor {
    /// This tensor as a float tensor: floats (16-bit ones included) as they are, others as f32.
    pub(crate) fn float(&self) -> Tensor {
        if self.dtype().is_float() || self.dtype().is_half() { self.clone() } else { self.cast(DType::F32) }
    }

    /// `f` computed on this 16-bit tensor widened to f32, rounded back to its dtype: 16-bit
    /// tensors store 16 bits and compute in f32, as torch's do.
    pub(crate) fn via_f32(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        f(&self.cast(DType::F32)).cast(self.dtype())
    }

    fn unary(&self, op: UnaryOp) -> Tensor {
        if self.dtype().is_half() {
            return self.via_f32(|x| x.unary(op));
        }
        let x = if matches!(op, UnaryOp::Neg) && self.dtype() != DType::Bool {
            self.clone()
        } else {
            self.float()
        };
        let d = x.dtype();
        Tensor { uop: UOp::new(Op::Unary(op), d, vec![x.uop]) }
    }

    /// This tensor converted to `dtype`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 1.5], &[2]);
    /// assert_eq!(x.cast(uopc_ir::DType::F64).to_ndarray::<f64>()?.as_slice(), Some(&[0.5, 1.5][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// Casts to `bf16` and `f16` round to nearest even (from f64 through f32, as torch does);
    /// those between a 16-bit float and an integer or bool go through f32 (the IR converts
    /// 16-bit floats only to and from floats), so a large integer may round twice.
    pub fn cast(&self, dtype: DType) -> Tensor {
        let float_like = |d: DType| d.is_float() || d.is_half();
        let (from, to) = (self.dtype(), dtype);
        if from != to && (from.is_half() || to.is_half()) && !(float_like(from) && float_like(to)) {
            return Tensor { uop: self.uop.cast(DType::F32).cast(to) };
        }
        Tensor { uop: self.uop.cast(dtype) }
    }

    /// `-x`.
    pub fn neg(&self) -> Tensor {
        self.unary(UnaryOp::Neg)
    }
    /// `2^x`.
    pub fn exp2(&self) -> Tensor {
        self.unary(UnaryOp::Exp2)
    }
    /// `e^x`, as `exp2(x * log2 e)` with `log2 e` of the tensor's dtype.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let e = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).exp().to_ndarray::<f32>()?;
    /// assert!((e[0] - 1.0).abs() < 1e-6 && (e[1] - std::f32::consts::E).abs() < 1e-5);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn exp(&self) -> Tensor {
        if self.dtype().is_half() { self.via_f32(|x| x.exp_exact()) } else { self.float().exp_exact() }
    }
    /// `log2(x)`.
    pub fn log2(&self) -> Tensor {
        self.unary(UnaryOp::Log2)
    }
    /// Natural logarithm, as `log2(x) * ln 2` with `ln 2` of the tensor's dtype.
    pub fn log(&self) -> Tensor {
        if self.dtype().is_half() { self.via_f32(|x| x.ln_exact()) } else { self.float().ln_exact() }
    }
    /// Square root.
    pub fn sqrt(&self) -> Tensor {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1 / x`.
    pub fn recip(&self) -> Tensor {
        self.unary(UnaryOp::Recip)
    }
    /// `max(x, 0)`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let y = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], &[3]).relu();
    /// assert_eq!(y.to_ndarray::<f32>()?.as_slice(), Some(&[0.0, 0.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn relu(&self) -> Tensor {
        self.scalar_op(BinaryOp::Max, ConstValue::float(0.0), false)
    }

    /// Both operands broadcast to their common shape (numpy rules) and promoted to one dtype.
    pub(super) fn broadcast_pair(&self, other: &Tensor, op: &'static str) -> Result<(Tensor, Tensor)> {
        let shape = broadcast_shape(self.shape(), other.shape()).ok_or_else(|| {
            shape_err(op, format!("shapes {:?} and {:?} do not broadcast", self.shape(), other.shape()))
        })?;
        let d = promote(self.dtype(), other.dtype());
        let a = self.cast(d).try_broadcast_to(&shape).map_err(|e| e.in_op(op))?;
        let b = other.cast(d).try_broadcast_to(&shape).map_err(|e| e.in_op(op))?;
        Ok((a, b))
    }

    fn try_binary(&self, other: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        let (mut a, mut b) = self.broadcast_pair(other, name)?;
        let half = a.dtype();
        if half.is_half() {
            let r = a.cast(DType::F32).try_binary(&b.cast(DType::F32), op, name)?;
            return Ok(if r.dtype() == DType::Bool { r } else { r.cast(half) });
        }
        let arith = !matches!(op, BinaryOp::CmpNe);
        if arith && a.dtype() == DType::Bool {
            a = a.cast(DType::F32);
            b = b.cast(DType::F32);
        }
        let dtype = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { a.dtype() };
        Ok(Tensor { uop: UOp::new(Op::Binary(op), dtype, vec![a.uop, b.uop]) })
    }

    /// `self op v` (or `v op self` when `reversed`) with the constant `v` converted once to
    /// the dtype the operation computes in: this tensor's, f32 for a bool tensor, f32 (then
    /// rounded back) for a 16-bit one.
    pub(crate) fn scalar_op(&self, op: BinaryOp, v: ConstValue, reversed: bool) -> Tensor {
        if self.dtype().is_half() {
            let r = self.cast(DType::F32).scalar_op(op, v, reversed);
            return if r.dtype() == DType::Bool { r } else { r.cast(self.dtype()) };
        }
        let x = if self.dtype() == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        let c = UOp::new(Op::Const(v.cast(x.dtype())), x.dtype(), vec![]);
        let dtype = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { x.dtype() };
        let src = if reversed { vec![c, x.uop] } else { vec![x.uop, c] };
        Tensor { uop: UOp::new(Op::Binary(op), dtype, src) }
    }

    /// `self + other` with broadcasting.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let col = Tensor::from_vec(vec![10.0f32, 20.0], &[2, 1]);
    /// let row = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    /// let sum = col.try_add(&row)?; // [2, 1] + [3] broadcast to [2, 3]
    /// assert_eq!(sum.to_ndarray::<f32>()?.as_slice(), Some(&[11.0, 12.0, 13.0, 21.0, 22.0, 23.0][..]));
    /// assert!(row.try_add(&Tensor::full(&[4], 1.0)).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_add(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Add, "add")
    }
    /// `self - other` with broadcasting.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_sub(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Sub, "sub")
    }
    /// `self * other` with broadcasting.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    /// assert_eq!(x.try_mul(&x)?.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 4.0, 9.0][..]));
    /// assert_eq!((&x * 2.0).to_ndarray::<f32>()?.as_slice(), Some(&[2.0, 4.0, 6.0][..])); // operators too
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_mul(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Mul, "mul")
    }
    /// `self / other` with broadcasting, as `self * recip(other)`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_div(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, "div")?;
        a.float().try_mul(&b.float().recip())
    }
    /// Elementwise maximum with broadcasting.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Max, "maximum")
    }
    /// Elementwise maximum with broadcasting; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn maximum(&self, other: &Tensor) -> Tensor {
        ok(self.try_maximum(other))
    }
    /// `self < other` (a Bool tensor).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0], &[2]);
    /// let small = x.try_lt(&Tensor::scalar(3.0))?.cast(uopc_ir::DType::F32);
    /// assert_eq!(small.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 0.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_lt(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::CmpLt, "lt")
    }
    /// `self > other`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_gt(&self, other: &Tensor) -> Result<Tensor> {
        self.reversed_compare(other, "gt")
    }
    /// `self != other`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_ne(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::CmpNe, "ne")
    }
    /// `self == other`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_eq(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.try_binary(other, BinaryOp::CmpNe, "eq")?.not())
    }
    /// `self <= other`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_le(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.reversed_compare(other, "le")?.not())
    }
    /// `self >= other`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming the operation when the shapes do not
    /// broadcast (numpy rules: aligned from the last axis, each pair equal or one of them 1).
    pub fn try_ge(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.try_binary(other, BinaryOp::CmpLt, "ge")?.not())
    }
    /// `other < self`, with shape errors naming `op` and the operands in the caller's order.
    fn reversed_compare(&self, other: &Tensor, op: &'static str) -> Result<Tensor> {
        if broadcast_shape(self.shape(), other.shape()).is_none() {
            return Err(shape_err(
                op,
                format!("shapes {:?} and {:?} do not broadcast", self.shape(), other.shape()),
            ));
        }
        other.try_binary(self, BinaryOp::CmpLt, op)
    }
    /// `self < other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn lt(&self, other: &Tensor) -> Tensor {
        ok(self.try_lt(other))
    }
    /// `self > other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn gt(&self, other: &Tensor) -> Tensor {
        ok(self.try_gt(other))
    }
    /// `self != other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn ne(&self, other: &Tensor) -> Tensor {
        ok(self.try_ne(other))
    }
    /// `self == other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn eq(&self, other: &Tensor) -> Tensor {
        ok(self.try_eq(other))
    }
    /// `self <= other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn le(&self, other: &Tensor) -> Tensor {
        ok(self.try_le(other))
    }
    /// `self >= other`; panics on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn ge(&self, other: &Tensor) -> Tensor {
        ok(self.try_ge(other))
    }

    /// Logical not of a Bool tensor (other dtypes: `x == 0`).
    pub fn not(&self) -> Tensor {
        let b = if self.dtype() == DType::Bool {
            self.clone()
        } else {
            self.scalar_op(BinaryOp::CmpNe, ConstValue::float(0.0), false)
        };
        let t = const_of(1.0, DType::Bool);
        let f = const_of(0.0, DType::Bool);
        Tensor { uop: UOp::new(Op::Where, DType::Bool, vec![b.uop, f, t]) }
    }

    /// `self ? a : b` elementwise (`self` is the condition), with broadcasting of all three.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![-2.0f32, 3.0], &[2]);
    /// let abs = x.lt(&Tensor::scalar(0.0)).try_where(&-&x, &x)?;
    /// assert_eq!(abs.to_ndarray::<f32>()?.as_slice(), Some(&[2.0, 3.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `where` when the condition and the two
    /// branches do not broadcast to one shape.
    pub fn try_where(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape(self.shape(), a.shape())
            .and_then(|s| broadcast_shape(&s, b.shape()))
            .ok_or_else(|| {
                shape_err(
                    "where",
                    format!(
                        "condition {:?} and branches {:?}, {:?} do not broadcast",
                        self.shape(),
                        a.shape(),
                        b.shape()
                    ),
                )
            })?;
        let c = if self.dtype() == DType::Bool { self.clone() } else { self.not().not() };
        let d = promote(a.dtype(), b.dtype());
        let (c, a, b) = (
            c.try_broadcast_to(&shape).map_err(|e| e.in_op("where"))?,
            a.cast(d).try_broadcast_to(&shape).map_err(|e| e.in_op("where"))?,
            b.cast(d).try_broadcast_to(&shape).map_err(|e| e.in_op("where"))?,
        );
        Ok(Tensor { uop: UOp::new(Op::Where, d, vec![c.uop, a.uop, b.uop]) })
    }
    /// [`Tensor::try_where`], panicking on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not broadcast.
    #[track_caller]
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Tensor {
        ok(self.try_where(a, b))
    }

    /// The same values, computed once into a buffer of their own by the realize that needs
    /// them (a kernel boundary): the kernels reading this tensor read that buffer instead of
    /// fusing its computation into themselves. Worth it where a consumer runs faster on a
    /// stored operand (a product over values rounded to bf16 runs the bf16 GEMM only when
    /// they are a bf16 buffer) or where recomputing the values per read costs more than
    /// storing them. Gradients pass through unchanged.
    ///
    /// ```rust
    /// use uopc_ir::DType;
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let rounded = (&x * 1.5).cast(DType::BF16).staged();
    /// let y = rounded.cast(DType::F32).matmul(&x).to_ndarray::<f32>()?;
    /// assert_eq!(y[[0, 0]], 1.5 * 1.0 + 3.0 * 3.0);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn staged(&self) -> Tensor {
        let d = self.dtype();
        Tensor { uop: UOp::new(Op::Stage, d, vec![self.uop.clone()]) }
    }

    /// The same values with gradients stopped (no effect on the forward computation).
    pub fn detach(&self) -> Tensor {
        let d = self.dtype();
        Tensor { uop: UOp::new(Op::Detach, d, vec![self.uop.clone()]) }
    }
}
