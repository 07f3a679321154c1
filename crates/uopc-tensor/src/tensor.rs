//! The lazy `Tensor`: every operation builds a UOp node; nothing runs until `realize`.
//!
//! Error style: every fallible operation has a `try_` method returning [`Result`]; the plain
//! method and the std operators panic with the same message at the caller's location
//! (`#[track_caller]`). Shape errors name the operation and both shapes.

use crate::error::{Result, TensorError, shape_err};
use crate::realize::{RealizeOptions, RealizeReport, realize};
use ndarray::{ArrayBase, ArrayD, Dimension, IxDyn};
use std::fmt;
use std::ops;
use std::sync::Arc;
use uopc_ir::{BinaryOp, DType, DataRef, HostBuffer, Op, ReduceOp, UOp, UnaryOp, const_of};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

/// Element types a tensor can be built from and read back as.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching IR dtype.
    const DTYPE: DType;
    /// Wraps a vector as a host buffer.
    fn into_host(v: Vec<Self>) -> HostBuffer;
    /// The elements of a host buffer of this dtype.
    fn from_host(h: &HostBuffer) -> Option<&[Self]>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::F32(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::F64(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::F64(v) => Some(v),
            _ => None,
        }
    }
}

/// A lazy tensor: a handle on a node of the UOp graph. Cloning is cheap.
#[derive(Clone)]
pub struct Tensor {
    uop: UOp,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({:?}, {}, {})", self.shape(), self.dtype(), self.uop.op().name())
    }
}

#[track_caller]
fn ok(r: Result<Tensor>) -> Tensor {
    match r {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

/// Tensors may have at most this many elements: indices stay far from overflow, and a typo in
/// a shape fails here, where it was written, instead of as an allocation failure later.
pub const MAX_ELEMENTS: usize = 1 << 40;

fn check_size(op: &'static str, shape: &[usize]) -> Result<()> {
    if numel(shape) > MAX_ELEMENTS {
        return Err(shape_err(op, format!("shape {shape:?} has more than 2^40 elements")));
    }
    Ok(())
}

fn check_nonzero(op: &'static str, shape: &[usize]) -> Result<()> {
    if shape.contains(&0) {
        return Err(shape_err(op, format!("shape {shape:?} has a zero-sized axis, which is not supported")));
    }
    Ok(())
}

/// The numpy broadcast of two shapes, if they are compatible.
fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for k in 0..n {
        let x = if k + a.len() >= n { a[k + a.len() - n] } else { 1 };
        let y = if k + b.len() >= n { b[k + b.len() - n] } else { 1 };
        out[k] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn promote(a: DType, b: DType) -> DType {
    a.max(b)
}

impl Tensor {
    pub(crate) fn from_uop(uop: UOp) -> Tensor {
        Tensor { uop }
    }

    fn data(buf: HostBuffer, shape: &[usize]) -> Tensor {
        let dtype = buf.dtype();
        let data = DataRef(Arc::new(buf));
        Tensor { uop: UOp::new(Op::Data { data, shape: shape.to_vec() }, dtype, vec![]) }
    }

    /// A tensor holding `data` (row-major) with `shape`.
    pub fn try_from_vec<E: Element>(data: Vec<E>, shape: &[usize]) -> Result<Tensor> {
        check_nonzero("from_vec", shape)?;
        if data.len() != numel(shape) {
            return Err(shape_err(
                "from_vec",
                format!("{} elements do not fill shape {shape:?} ({} elements)", data.len(), numel(shape)),
            ));
        }
        Ok(Tensor::data(E::into_host(data), shape))
    }

    /// [`Tensor::try_from_vec`], panicking on a length mismatch.
    #[track_caller]
    pub fn from_vec<E: Element>(data: Vec<E>, shape: &[usize]) -> Tensor {
        ok(Tensor::try_from_vec(data, shape))
    }

    /// A tensor with a copy of an ndarray's elements (any layout, logical order).
    #[track_caller]
    pub fn from_array<E: Element, S: ndarray::Data<Elem = E>, D: Dimension>(a: &ArrayBase<S, D>) -> Tensor {
        ok(Tensor::try_from_vec(a.iter().copied().collect(), a.shape()))
    }

    /// A 0-d tensor holding `v`.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::data(HostBuffer::F32(vec![v]), &[])
    }

    /// A tensor of `shape` filled with `v` (a broadcast constant: no memory until realized).
    #[track_caller]
    pub fn full(shape: &[usize], v: f32) -> Tensor {
        let c = Tensor { uop: const_of(v as f64, DType::F32) };
        if shape.is_empty() {
            c
        } else {
            ok(c.try_reshape(&vec![1; shape.len()]).and_then(|t| t.try_expand(shape)))
        }
    }

    /// The UOp this tensor stands for.
    pub fn uop(&self) -> &UOp {
        &self.uop
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.uop.shape()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.uop.dtype()
    }
    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(self.shape())
    }

    fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let n = self.ndim() as isize;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(shape_err(op, format!("axis {axis} is out of range for shape {:?}", self.shape())));
        }
        Ok(a as usize)
    }

    // ---------------- elementwise ----------------

    fn float(&self) -> Tensor {
        if self.dtype().is_float() { self.clone() } else { self.cast(DType::F32) }
    }

    fn unary(&self, op: UnaryOp) -> Tensor {
        let x = if matches!(op, UnaryOp::Neg) && self.dtype() != DType::Bool {
            self.clone()
        } else {
            self.float()
        };
        let d = x.dtype();
        Tensor { uop: UOp::new(Op::Unary(op), d, vec![x.uop]) }
    }

    /// This tensor converted to `dtype`.
    pub fn cast(&self, dtype: DType) -> Tensor {
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
    /// `e^x`, as `exp2(x * log2 e)`.
    pub fn exp(&self) -> Tensor {
        (self.float() * LOG2E as f32).exp2()
    }
    /// `log2(x)`.
    pub fn log2(&self) -> Tensor {
        self.unary(UnaryOp::Log2)
    }
    /// Natural logarithm, as `log2(x) * ln 2`.
    pub fn log(&self) -> Tensor {
        self.log2() * LN2 as f32
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
    pub fn relu(&self) -> Tensor {
        self.scalar_op(BinaryOp::Max, 0.0, false)
    }

    /// Both operands broadcast to their common shape (numpy rules) and promoted to one dtype.
    fn broadcast_pair(&self, other: &Tensor, op: &'static str) -> Result<(Tensor, Tensor)> {
        let shape = broadcast_shape(self.shape(), other.shape()).ok_or_else(|| {
            shape_err(op, format!("shapes {:?} and {:?} do not broadcast", self.shape(), other.shape()))
        })?;
        let d = promote(self.dtype(), other.dtype());
        let a = self.cast(d).try_broadcast_to(&shape)?;
        let b = other.cast(d).try_broadcast_to(&shape)?;
        Ok((a, b))
    }

    fn try_binary(&self, other: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        let (mut a, mut b) = self.broadcast_pair(other, name)?;
        let arith = !matches!(op, BinaryOp::CmpNe);
        if arith && a.dtype() == DType::Bool {
            a = a.cast(DType::F32);
            b = b.cast(DType::F32);
        }
        let dtype = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { a.dtype() };
        Ok(Tensor { uop: UOp::new(Op::Binary(op), dtype, vec![a.uop, b.uop]) })
    }

    fn scalar_op(&self, op: BinaryOp, v: f32, reversed: bool) -> Tensor {
        let x = if self.dtype() == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        let c = const_of(v as f64, x.dtype());
        let dtype = if matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) { DType::Bool } else { x.dtype() };
        let src = if reversed { vec![c, x.uop] } else { vec![x.uop, c] };
        Tensor { uop: UOp::new(Op::Binary(op), dtype, src) }
    }

    /// `self + other` with broadcasting.
    pub fn try_add(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Add, "add")
    }
    /// `self - other` with broadcasting.
    pub fn try_sub(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Sub, "sub")
    }
    /// `self * other` with broadcasting.
    pub fn try_mul(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Mul, "mul")
    }
    /// `self / other` with broadcasting, as `self * recip(other)`.
    pub fn try_div(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, "div")?;
        a.float().try_mul(&b.float().recip())
    }
    /// Elementwise maximum with broadcasting.
    pub fn try_maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::Max, "maximum")
    }
    /// Elementwise maximum with broadcasting; panics on incompatible shapes.
    #[track_caller]
    pub fn maximum(&self, other: &Tensor) -> Tensor {
        ok(self.try_maximum(other))
    }
    /// `self < other` (a Bool tensor).
    pub fn try_lt(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::CmpLt, "lt")
    }
    /// `self > other`.
    pub fn try_gt(&self, other: &Tensor) -> Result<Tensor> {
        other.try_binary(self, BinaryOp::CmpLt, "gt")
    }
    /// `self != other`.
    pub fn try_ne(&self, other: &Tensor) -> Result<Tensor> {
        self.try_binary(other, BinaryOp::CmpNe, "ne")
    }
    /// `self == other`.
    pub fn try_eq(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.try_binary(other, BinaryOp::CmpNe, "eq")?.not())
    }
    /// `self <= other`.
    pub fn try_le(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.try_gt(other)?.not())
    }
    /// `self >= other`.
    pub fn try_ge(&self, other: &Tensor) -> Result<Tensor> {
        Ok(self.try_lt(other)?.not())
    }
    /// `self < other`; panics on incompatible shapes.
    #[track_caller]
    pub fn lt(&self, other: &Tensor) -> Tensor {
        ok(self.try_lt(other))
    }
    /// `self > other`; panics on incompatible shapes.
    #[track_caller]
    pub fn gt(&self, other: &Tensor) -> Tensor {
        ok(self.try_gt(other))
    }
    /// `self != other`; panics on incompatible shapes.
    #[track_caller]
    pub fn ne(&self, other: &Tensor) -> Tensor {
        ok(self.try_ne(other))
    }
    /// `self == other`; panics on incompatible shapes.
    #[track_caller]
    pub fn eq(&self, other: &Tensor) -> Tensor {
        ok(self.try_eq(other))
    }
    /// `self <= other`; panics on incompatible shapes.
    #[track_caller]
    pub fn le(&self, other: &Tensor) -> Tensor {
        ok(self.try_le(other))
    }
    /// `self >= other`; panics on incompatible shapes.
    #[track_caller]
    pub fn ge(&self, other: &Tensor) -> Tensor {
        ok(self.try_ge(other))
    }

    /// Logical not of a Bool tensor (other dtypes: `x == 0`).
    pub fn not(&self) -> Tensor {
        let b = if self.dtype() == DType::Bool {
            self.clone()
        } else {
            self.scalar_op(BinaryOp::CmpNe, 0.0, false)
        };
        let t = const_of(1.0, DType::Bool);
        let f = const_of(0.0, DType::Bool);
        Tensor { uop: UOp::new(Op::Where, DType::Bool, vec![b.uop, f, t]) }
    }

    /// `self ? a : b` elementwise (`self` is the condition), with broadcasting of all three.
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
            c.try_broadcast_to(&shape)?,
            a.cast(d).try_broadcast_to(&shape)?,
            b.cast(d).try_broadcast_to(&shape)?,
        );
        Ok(Tensor { uop: UOp::new(Op::Where, d, vec![c.uop, a.uop, b.uop]) })
    }
    /// [`Tensor::try_where`], panicking on incompatible shapes.
    #[track_caller]
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Tensor {
        ok(self.try_where(a, b))
    }

    /// The same values with gradients stopped (no effect on the forward computation).
    pub fn detach(&self) -> Tensor {
        let d = self.dtype();
        Tensor { uop: UOp::new(Op::Detach, d, vec![self.uop.clone()]) }
    }

    // ---------------- movement ----------------

    /// The same elements viewed with another shape of the same element count.
    pub fn try_reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_nonzero("reshape", shape)?;
        check_size("reshape", shape)?;
        if numel(shape) != self.numel() {
            return Err(shape_err("reshape", format!("cannot reshape {:?} to {shape:?}", self.shape())));
        }
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let base = if matches!(self.uop.op(), Op::Reshape(_)) {
            self.uop.src()[0].clone()
        } else {
            self.uop.clone()
        };
        if base.shape() == shape {
            return Ok(Tensor { uop: base });
        }
        Ok(Tensor { uop: UOp::new(Op::Reshape(shape.to_vec()), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_reshape`], panicking on a size mismatch.
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Tensor {
        ok(self.try_reshape(shape))
    }

    /// Broadcast axes of size 1 to `shape` (same rank).
    pub fn try_expand(&self, shape: &[usize]) -> Result<Tensor> {
        let s = self.shape();
        if s.len() != shape.len()
            || s.iter().zip(shape).any(|(&a, &b)| a != b && a != 1)
            || shape.contains(&0)
        {
            return Err(shape_err("expand", format!("cannot expand {s:?} to {shape:?}")));
        }
        check_size("expand", shape)?;
        if s == shape {
            return Ok(self.clone());
        }
        let base =
            if matches!(self.uop.op(), Op::Expand(_)) { self.uop.src()[0].clone() } else { self.uop.clone() };
        Ok(Tensor { uop: UOp::new(Op::Expand(shape.to_vec()), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_expand`], panicking on incompatible shapes.
    #[track_caller]
    pub fn expand(&self, shape: &[usize]) -> Tensor {
        ok(self.try_expand(shape))
    }

    /// numpy's `broadcast_to`: new leading axes, then size-1 axes stretched.
    pub fn try_broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let s = self.shape();
        if s.len() > shape.len() {
            return Err(shape_err("broadcast_to", format!("cannot broadcast {s:?} to {shape:?}")));
        }
        if matches!(self.uop.op(), Op::Const(_)) && s.is_empty() {
            // a scalar constant broadcasts implicitly; keep it a CONST so kernels fold it
            return Ok(self.clone());
        }
        let mut padded = vec![1; shape.len() - s.len()];
        padded.extend_from_slice(s);
        self.try_reshape(&padded)?
            .try_expand(shape)
            .map_err(|_| shape_err("broadcast_to", format!("cannot broadcast {s:?} to {shape:?}")))
    }

    /// Axes reordered: output axis `k` is input axis `perm[k]`.
    pub fn try_permute(&self, perm: &[usize]) -> Result<Tensor> {
        let n = self.ndim();
        let mut seen = vec![false; n];
        if perm.len() != n || perm.iter().any(|&p| p >= n || std::mem::replace(&mut seen[p], true)) {
            return Err(shape_err(
                "permute",
                format!("{perm:?} is not a permutation of the axes of {:?}", self.shape()),
            ));
        }
        let (base, perm) = match self.uop.op() {
            Op::Permute(inner) => {
                (self.uop.src()[0].clone(), perm.iter().map(|&p| inner[p]).collect::<Vec<_>>())
            }
            _ => (self.uop.clone(), perm.to_vec()),
        };
        if perm.iter().enumerate().all(|(k, &p)| k == p) {
            return Ok(Tensor { uop: base });
        }
        Ok(Tensor { uop: UOp::new(Op::Permute(perm), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_permute`], panicking on an invalid permutation.
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Tensor {
        ok(self.try_permute(perm))
    }

    /// Axes `a` and `b` swapped (negative axes count from the end).
    pub fn try_transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (self.axis("transpose", a)?, self.axis("transpose", b)?);
        let mut perm: Vec<usize> = (0..self.ndim()).collect();
        perm.swap(a, b);
        self.try_permute(&perm)
    }
    /// [`Tensor::try_transpose`], panicking on invalid axes.
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Tensor {
        ok(self.try_transpose(a, b))
    }
    /// The last two axes swapped (`T` of a matrix); panics on fewer than two axes.
    #[track_caller]
    pub fn t(&self) -> Tensor {
        ok(self.try_transpose(-2, -1))
    }

    /// Each axis restricted to `begin..end`.
    pub fn try_shrink(&self, bounds: &[(usize, usize)]) -> Result<Tensor> {
        let s = self.shape();
        if bounds.len() != s.len() || bounds.iter().zip(s).any(|(&(b, e), &n)| b >= e || e > n) {
            return Err(shape_err("shrink", format!("bounds {bounds:?} do not fit shape {s:?}")));
        }
        if bounds.iter().zip(s).all(|(&(b, e), &n)| b == 0 && e == n) {
            return Ok(self.clone());
        }
        Ok(Tensor { uop: UOp::new(Op::Shrink(bounds.to_vec()), self.dtype(), vec![self.uop.clone()]) })
    }
    /// [`Tensor::try_shrink`], panicking on bounds that do not fit.
    #[track_caller]
    pub fn shrink(&self, bounds: &[(usize, usize)]) -> Tensor {
        ok(self.try_shrink(bounds))
    }
    /// `begin..end` along one axis.
    pub fn try_slice(&self, axis: isize, begin: usize, end: usize) -> Result<Tensor> {
        let a = self.axis("slice", axis)?;
        let mut b: Vec<(usize, usize)> = self.shape().iter().map(|&n| (0, n)).collect();
        b[a] = (begin, end);
        self.try_shrink(&b).map_err(|_| {
            shape_err("slice", format!("{begin}..{end} does not fit axis {axis} of shape {:?}", self.shape()))
        })
    }
    /// [`Tensor::try_slice`], panicking on bounds that do not fit.
    #[track_caller]
    pub fn slice(&self, axis: isize, begin: usize, end: usize) -> Tensor {
        ok(self.try_slice(axis, begin, end))
    }

    /// Tensors of one shape stacked along a new axis `axis`.
    pub fn try_stack(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| shape_err("stack", "needs at least one tensor"))?;
        let shape = first.shape();
        if let Some(t) = tensors.iter().find(|t| t.shape() != shape) {
            return Err(shape_err("stack", format!("shapes {shape:?} and {:?} differ", t.shape())));
        }
        let n = shape.len() as isize + 1;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(shape_err("stack", format!("axis {axis} is out of range for {} stacked axes", n)));
        }
        let d = tensors.iter().map(|t| t.dtype()).max().expect("non-empty");
        let src: Vec<UOp> = tensors.iter().map(|t| t.cast(d).uop).collect();
        let stacked = Tensor { uop: UOp::new(Op::Stack, d, src) };
        let mut perm: Vec<usize> = (1..n as usize).collect();
        perm.insert(a as usize, 0);
        stacked.try_permute(&perm)
    }
    /// [`Tensor::try_stack`], panicking on differing shapes.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], axis: isize) -> Tensor {
        ok(Tensor::try_stack(tensors, axis))
    }

    /// Tensors concatenated along `axis`. Built from SHRINK, STACK and RESHAPE: every input is
    /// cut into chunks of the gcd of the sizes along `axis`, the chunks are stacked and the
    /// stack axis is merged into `axis`.
    pub fn try_cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| shape_err("cat", "needs at least one tensor"))?;
        let a = first.axis("cat", axis)?;
        for t in tensors {
            let ok = t.ndim() == first.ndim()
                && t.shape().iter().zip(first.shape()).enumerate().all(|(k, (x, y))| k == a || x == y);
            if !ok {
                return Err(shape_err(
                    "cat",
                    format!("shapes {:?} and {:?} differ outside axis {axis}", first.shape(), t.shape()),
                ));
            }
        }
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        fn gcd(a: usize, b: usize) -> usize {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let g = tensors.iter().fold(0, |g, t| gcd(g, t.shape()[a]));
        let mut chunks = Vec::new();
        for t in tensors {
            for c in 0..t.shape()[a] / g {
                chunks.push(t.try_slice(a as isize, c * g, (c + 1) * g)?);
            }
        }
        let refs: Vec<&Tensor> = chunks.iter().collect();
        let stacked = Tensor::try_stack(&refs, a as isize)?; // (.., C, g, ..)
        let mut shape = first.shape().to_vec();
        shape[a] = chunks.len() * g;
        stacked.try_reshape(&shape)
    }
    /// [`Tensor::try_cat`], panicking on incompatible shapes.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Tensor {
        ok(Tensor::try_cat(tensors, axis))
    }

    // ---------------- reductions ----------------

    fn try_reduce(&self, op: ReduceOp, axis: isize, keepdim: bool, name: &'static str) -> Result<Tensor> {
        let a = self.axis(name, axis)?;
        let n = self.ndim();
        let x = if self.dtype() == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        let x = if a == n - 1 {
            x
        } else {
            let perm: Vec<usize> = (0..n).filter(|&k| k != a).chain([a]).collect();
            x.try_permute(&perm)?
        };
        let d = x.dtype();
        let r = Tensor { uop: UOp::new(Op::Reduce { op, axes: 1 }, d, vec![x.uop]) };
        if keepdim {
            let mut shape = self.shape().to_vec();
            shape[a] = 1;
            r.try_reshape(&shape)
        } else {
            Ok(r)
        }
    }
    /// Sum over `axis` (negative counts from the end), keeping it as size 1 if `keepdim`.
    pub fn try_sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(ReduceOp::Add, axis, keepdim, "sum")
    }
    /// [`Tensor::try_sum`], panicking on an invalid axis.
    #[track_caller]
    pub fn sum(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_sum(axis, keepdim))
    }
    /// Maximum over `axis`, keeping it as size 1 if `keepdim`.
    pub fn try_max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(ReduceOp::Max, axis, keepdim, "max")
    }
    /// [`Tensor::try_max`], panicking on an invalid axis.
    #[track_caller]
    pub fn max(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_max(axis, keepdim))
    }

    /// Matrix product of `(n, k)` and `(k, m)`, as broadcast-multiply-reduce: `(n, m, k)`
    /// products summed over the last, contiguous axis.
    pub fn try_matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.shape(), other.shape());
        if a.len() != 2 || b.len() != 2 || a[1] != b[0] {
            return Err(shape_err("matmul", format!("cannot multiply {a:?} by {b:?}")));
        }
        let (n, k, m) = (a[0], a[1], b[1]);
        let x = self.try_reshape(&[n, 1, k])?.try_expand(&[n, m, k])?;
        let y = other.try_transpose(0, 1)?.try_reshape(&[1, m, k])?.try_expand(&[n, m, k])?;
        x.try_mul(&y)?.try_sum(-1, false)
    }
    /// [`Tensor::try_matmul`], panicking on incompatible shapes.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        ok(self.try_matmul(other))
    }

    /// Softmax along `axis`: max-subtracted, with `exp` as `exp2` and log2(e) folded in.
    pub fn try_softmax(&self, axis: isize) -> Result<Tensor> {
        let x = self.float();
        let m = x.try_max(axis, true)?;
        let e = (x.try_sub(&m)? * LOG2E as f32).exp2();
        e.try_mul(&e.try_sum(axis, true)?.recip())
    }
    /// [`Tensor::try_softmax`], panicking on an invalid axis.
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        ok(self.try_softmax(axis))
    }

    // ---------------- realize ----------------

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
                $op(self, rhs)
            }
        }
        impl ops::$trait<f32> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f32) -> Tensor {
                $op(&self, rhs)
            }
        }
        impl ops::$trait<&Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                $rev(self, rhs)
            }
        }
        impl ops::$trait<Tensor> for f32 {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                $rev(self, &rhs)
            }
        }
    };
}

tensor_binop!(Add, add, try_add, |t: &Tensor, v| t.scalar_op(BinaryOp::Add, v, false), |v, t: &Tensor| t
    .scalar_op(BinaryOp::Add, v, true));
tensor_binop!(Sub, sub, try_sub, |t: &Tensor, v| t.scalar_op(BinaryOp::Sub, v, false), |v, t: &Tensor| t
    .scalar_op(BinaryOp::Sub, v, true));
tensor_binop!(Mul, mul, try_mul, |t: &Tensor, v| t.scalar_op(BinaryOp::Mul, v, false), |v, t: &Tensor| t
    .scalar_op(BinaryOp::Mul, v, true));
tensor_binop!(
    Div,
    div,
    try_div,
    |t: &Tensor, v: f32| t.float().scalar_op(BinaryOp::Mul, 1.0 / v, false),
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
