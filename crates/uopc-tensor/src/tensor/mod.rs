//! The lazy `Tensor`: every operation builds a UOp node; nothing runs until `realize`.
//!
//! Error style: every fallible operation has a `try_` method returning [`Result`]; the plain
//! method and the std operators panic with the same message at the caller's location
//! (`#[track_caller]`). Shape errors name the operation and both shapes.

use crate::error::{Result, shape_err};
use crate::util::numel;
use std::fmt;
use std::sync::Arc;
use uopc_ir::{DType, DataRef, HostBuffer, Op, UOp};

mod argmax;
mod convert;
mod create;
mod custom;
pub(crate) use custom::{AttachedVjp, custom_vjp};
pub use custom::{CustomVjp, CustomVjpWanted};
mod display;
mod elementwise;
mod erf;
mod gather;
mod gradient_rule;
pub use gradient_rule::GradientRule;
pub(crate) use gradient_rule::gradient_rule;
mod index;
mod math;
mod movement;
mod nn;
mod operators;
mod reduce;
mod scalar;
pub use scalar::Scalar;
mod strided;
pub use strided::StridedView;

const LOG2E: f64 = std::f64::consts::LOG2_E;

/// Element types a tensor can be built from and read back as: `f32`, `f64`, `bf16`, `f16`,
/// `i32`, `i64` and `bool`.
///
/// Integer tensors take the ops that make sense for them (arithmetic that wraps, `maximum`,
/// `minimum`, `abs`, comparisons, `where`, sums and maxima, matmul, casts); float functions
/// and true division give f32 results, and there is no gradient through integers.
///
/// ```rust
/// use uopc_tensor::Tensor;
/// let x = Tensor::from_vec(vec![3i32, 1], &[2]);
/// assert_eq!((&x * &x).sum(0, false).to_ndarray::<i32>()?[[]], 10);
/// assert_eq!(x.lt(&Tensor::from_vec(vec![2i32, 2], &[2])).to_ndarray::<bool>()?.as_slice(), Some(&[false, true][..]));
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching IR dtype.
    const DTYPE: DType;
    /// Wraps a vector as a host buffer.
    fn into_host(v: Vec<Self>) -> HostBuffer;
    /// The elements of a host buffer of this dtype.
    fn from_host(h: &HostBuffer) -> Option<&[Self]>;
    /// `s` as f32s when `Self` is `f32`: the dtype the JIT can write straight into a caller's
    /// memory (see [`Tensor::realize_into`]).
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
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
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::BF16(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::BF16(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::F16(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::F16(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::I32(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::I32(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::I64(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::I64(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn into_host(v: Vec<Self>) -> HostBuffer {
        HostBuffer::Bool(v)
    }
    fn from_host(h: &HostBuffer) -> Option<&[Self]> {
        match h {
            HostBuffer::Bool(v) => Some(v),
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
///
/// Operations only build graph nodes; nothing is computed until the tensor is realized
/// ([`Tensor::realize`], [`Tensor::to_ndarray`], [`realize`](crate::realize)). Realizing
/// returns a new tensor backed by the computed values and leaves the tensor it was called on
/// as it was (lazy). So dropping a `Tensor` unread is almost always a mistake either way, and
/// every `Tensor` is `#[must_use]`: a lazy one was never computed, a realized one's values are
/// lost.
///
/// ```rust
/// use uopc_tensor::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
/// let y = (&x * 2.0 + 1.0).relu(); // a graph of three nodes over x; nothing has run
/// assert_eq!(y.to_string(), "Tensor [2, 2] f32 (lazy MAX: realize it to see the values)");
/// assert_eq!(y.realize()?.to_string(), "Tensor [2, 2] f32\n[[3.0, 5.0],\n [7.0, 9.0]]");
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Panics
///
/// The std operators (`+ - * /` between tensors) and the methods without a `try_` prefix
/// panic, at the caller's location, where the `try_` methods return an error.
#[derive(Clone)]
#[must_use = "a lazy Tensor dropped unread is never computed; a realized one dropped loses its values \
              (the tensor `realize` was called on stays lazy and would compute them again)"]
pub struct Tensor {
    uop: UOp,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({:?}, {}, {})", self.shape(), self.dtype(), self.uop.op().name())
    }
}

#[track_caller]
pub(crate) fn ok(r: Result<Tensor>) -> Tensor {
    match r {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

/// Tensors may have at most this many elements, and each axis at most this size, also in a
/// shape with a zero-sized axis: indices stay far from overflow, and a typo in a shape fails
/// here, where it was written, instead of as an allocation failure later.
pub const MAX_ELEMENTS: usize = 1 << 40;

/// Whether `shape` is within [`MAX_ELEMENTS`]: each axis, and the product of the non-zero
/// axes (an empty tensor's views and strides still multiply its other axes, so a 0 must not
/// hide an overflow).
pub(crate) fn check_size(op: &'static str, shape: &[usize]) -> Result<()> {
    if let Some((axis, n)) = shape.iter().enumerate().find(|&(_, &n)| n > MAX_ELEMENTS) {
        return Err(shape_err(op, format!("axis {axis} of shape {shape:?} has size {n}, more than 2^40")));
    }
    let nonzero = shape.iter().filter(|&&n| n > 0).fold(1usize, |a, &n| a.saturating_mul(n));
    if nonzero > MAX_ELEMENTS {
        return Err(shape_err(op, format!("shape {shape:?} has more than 2^40 elements")));
    }
    Ok(())
}

/// The numpy broadcast of two shapes, if they are compatible.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
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

pub(crate) fn promote(a: DType, b: DType) -> DType {
    match (a.is_half(), b.is_half()) {
        // bf16 and f16 meet in f32, which holds both exactly (as torch promotes them).
        (true, true) if a != b => DType::F32,
        // A 16-bit float beside an f32 or f64 widens to it; beside an integer or a bool it is
        // the float the pair computes in.
        (true, _) if b.is_float() => b,
        (_, true) if a.is_float() => a,
        (true, _) => a,
        (_, true) => b,
        _ => a.max(b),
    }
}

impl Tensor {
    pub(crate) fn from_uop(uop: UOp) -> Tensor {
        Tensor { uop }
    }

    pub(crate) fn data(buf: HostBuffer, shape: &[usize]) -> Tensor {
        let dtype = buf.dtype();
        let data = DataRef(Arc::new(buf));
        Tensor { uop: UOp::new(Op::Data { data, shape: shape.to_vec() }, dtype, vec![]) }
    }

    /// A tensor holding `data` (row-major) with `shape`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::try_from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// assert_eq!((x.shape(), x.ndim(), x.numel()), (&[2, 3][..], 2, 6));
    /// assert!(Tensor::try_from_vec(vec![1.0f32; 5], &[2, 3]).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `from_vec` when `data` does not have exactly
    /// as many elements as `shape` (none for a shape with a zero-sized axis), or `shape` has
    /// more than 2^40 elements or an axis over 2^40 (a zero-sized axis does not excuse the
    /// others).
    pub fn try_from_vec<E: Element>(data: Vec<E>, shape: &[usize]) -> Result<Tensor> {
        check_size("from_vec", shape)?;
        if data.len() != numel(shape) {
            return Err(shape_err(
                "from_vec",
                format!("{} elements do not fill shape {shape:?} ({} elements)", data.len(), numel(shape)),
            ));
        }
        Ok(Tensor::data(E::into_host(data), shape))
    }

    /// [`Tensor::try_from_vec`], panicking on a length mismatch.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]);
    /// assert_eq!(x.dtype(), uopc_ir::DType::F64);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On a length that does not fill `shape` (the error [`Tensor::try_from_vec`] returns).
    #[track_caller]
    pub fn from_vec<E: Element>(data: Vec<E>, shape: &[usize]) -> Tensor {
        ok(Tensor::try_from_vec(data, shape))
    }

    /// A tensor of `shape` and `dtype` with no elements (`shape` has a zero-sized axis): what
    /// every op whose result is empty stands for, so no kernel ever sees an empty axis.
    pub(crate) fn empty(shape: &[usize], dtype: DType) -> Tensor {
        debug_assert_eq!(numel(shape), 0);
        Tensor::data(HostBuffer::zeros(dtype, 0), shape)
    }

    /// A 0-d f32 tensor holding `v` (f32 is the default float, as in torch; for a constant of
    /// a tensor's own dtype use [`Tensor::scalar_like`], for another dtype
    /// [`Tensor::try_full_dtype`] with an empty shape).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let half = Tensor::scalar(0.5);
    /// assert!(half.shape().is_empty());
    /// assert_eq!(half.to_ndarray::<f32>()?.sum(), 0.5);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn scalar(v: f32) -> Tensor {
        Tensor::data(HostBuffer::F32(vec![v]), &[])
    }

    /// An f32 tensor of `shape` filled with `v` (a broadcast constant: no memory until
    /// realized); [`Tensor::try_full_dtype`] makes other dtypes, [`Tensor::full_like`] a
    /// tensor's own.
    ///
    /// Shapes with a zero-sized axis are allowed, here and in every op: such a tensor has no
    /// elements, ops on it give empty results without running a kernel, a sum over an empty
    /// axis is 0 and a max over one is an error (as in torch).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let ones = Tensor::try_full(&[2, 3], 1.0)?;
    /// assert_eq!(ones.sum(1, false).to_ndarray::<f32>()?.as_slice(), Some(&[3.0, 3.0][..]));
    /// let none = Tensor::try_full(&[0, 3], 1.0)?;
    /// assert_eq!((&none * 2.0).to_ndarray::<f32>()?.shape(), [0, 3]);
    /// assert_eq!(none.sum(0, false).to_ndarray::<f32>()?.as_slice(), Some(&[0.0; 3][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `full` when `shape` has more than 2^40
    /// elements or an axis over 2^40.
    pub fn try_full(shape: &[usize], v: f32) -> Result<Tensor> {
        Tensor::try_full_dtype(shape, v, DType::F32)
    }

    /// A tensor of `shape` and `dtype` filled with `v`, converted once to `dtype` (so an f64
    /// fill of 0.1 is the f64 0.1; a float fill of an integer dtype truncates, as a cast does).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// use uopc_ir::DType;
    /// let tenth = Tensor::try_full_dtype(&[2], 0.1, DType::F64)?;
    /// assert_eq!(tenth.to_ndarray::<f64>()?.as_slice(), Some(&[0.1, 0.1][..]));
    /// let big = Tensor::try_full_dtype(&[], (1i64 << 60) + 1, DType::I64)?;
    /// assert_eq!(big.to_ndarray::<i64>()?[[]], (1 << 60) + 1);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `full` when `shape` has more than 2^40
    /// elements or an axis over 2^40.
    pub fn try_full_dtype(shape: &[usize], v: impl Scalar, dtype: DType) -> Result<Tensor> {
        check_size("full", shape)?;
        let c = Tensor { uop: UOp::new(Op::Const(v.operand().value.cast(dtype)), dtype, vec![]) };
        if shape.is_empty() {
            return Ok(c);
        }
        c.try_reshape(&vec![1; shape.len()]).and_then(|t| t.try_expand(shape)).map_err(|e| e.in_op("full"))
    }

    /// [`Tensor::try_full_dtype`], panicking on an oversized shape.
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_full_dtype`] returns).
    #[track_caller]
    pub fn full_dtype(shape: &[usize], v: impl Scalar, dtype: DType) -> Tensor {
        ok(Tensor::try_full_dtype(shape, v, dtype))
    }

    /// [`Tensor::try_full`], panicking on a zero-sized axis or an oversized shape.
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_full`] returns).
    #[track_caller]
    pub fn full(shape: &[usize], v: f32) -> Tensor {
        ok(Tensor::try_full(shape, v))
    }

    /// The host buffer holding this tensor's elements, when it is backed by data (an input or
    /// a realized tensor) rather than a computation.
    pub(crate) fn host_data(&self) -> Option<&HostBuffer> {
        match self.uop.op() {
            Op::Data { data, .. } => data.0.downcast_ref::<HostBuffer>(),
            _ => None,
        }
    }

    /// Whether this tensor is backed by data (an input or the result of a realize), so that
    /// reading it computes nothing.
    pub fn is_realized(&self) -> bool {
        self.host_data().is_some()
    }

    /// The elements of a realized tensor (an input, or a realize's result), row-major,
    /// borrowed where they are; `None` for a tensor that is still a computation (realize it
    /// first) or whose dtype is not `E`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    /// assert_eq!(x.as_slice::<f32>(), Some(&[1.0, 2.0, 3.0][..]));
    /// let doubled = &x * 2.0;
    /// assert!(doubled.as_slice::<f32>().is_none()); // not computed yet
    /// assert_eq!(doubled.realize()?.as_slice::<f32>(), Some(&[2.0, 4.0, 6.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    pub fn as_slice<E: Element>(&self) -> Option<&[E]> {
        self.host_data().and_then(E::from_host).filter(|s| s.len() == self.numel())
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

    pub(crate) fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let n = self.ndim() as isize;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(shape_err(op, format!("axis {axis} is out of range for shape {:?}", self.shape())));
        }
        Ok(a as usize)
    }
}
