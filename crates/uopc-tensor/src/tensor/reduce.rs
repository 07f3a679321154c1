//! Reductions along one axis, and the ops built from them: matmul and softmax.

use super::{LOG2E, Tensor, ok, promote};
use crate::error::{Result, shape_err};
use uopc_ir::{DType, Op, ReduceOp, UOp};

/// The longest axis a float sum runs as one loop. Past it a running f32 sum stops being
/// accurate (2^24 + 1 is 2^24 again, so a sum of ones stalls there), and the sum is taken in
/// blocks instead, as torch's and numpy's cascaded sums are.
const SUM_SPLIT: usize = 1 << 16;
/// The length of each block of a split sum: blocks of ones sum exactly, and so do up to
/// `SUM_SPLIT` of their partial sums, level after level.
const SUM_BLOCK: usize = 1 << 12;

/// `x @ y` for matrices (batch axes allowed) `(.., n, k) @ (.., k, m)` with `k` longer than
/// [`SUM_SPLIT`]: the product of each block of [`SUM_BLOCK`] along `k` as a batch of products,
/// the partial products then summed by [`Tensor::try_sum`] (itself blocked), and a remainder
/// that fills no block added on its own. Each block stays a GEMM; the partial products take
/// `n * m * k / SUM_BLOCK` elements, a small fraction of an operand when `m` is 1.
fn blocked_vector_product(x: &Tensor, y: &Tensor, k: usize) -> Result<Tensor> {
    let body = k - k % SUM_BLOCK;
    let blocks = body / SUM_BLOCK;
    let (rx, ry) = (x.ndim(), y.ndim());
    let head_x = if body == k { x.clone() } else { x.try_slice(-1, 0, body)? };
    let head_y = if body == k { y.clone() } else { y.try_slice(-2, 0, body)? };
    // x: (.., n, blocks, B) -> (.., blocks, n, B); y: (.., blocks, B, m).
    let mut xs: Vec<usize> = x.shape()[..rx - 1].to_vec();
    xs.extend([blocks, SUM_BLOCK]);
    let mut perm: Vec<usize> = (0..rx - 2).collect();
    perm.extend([rx - 1, rx - 2, rx]);
    let bx = head_x.try_reshape(&xs)?.try_permute(&perm)?;
    let mut ys: Vec<usize> = y.shape()[..ry - 2].to_vec();
    ys.extend([blocks, SUM_BLOCK, y.shape()[ry - 1]]);
    let by = head_y.try_reshape(&ys)?;
    let total = bx.try_matmul(&by)?.try_sum(-3, false)?;
    if body == k {
        return Ok(total);
    }
    total.try_add(&x.try_slice(-1, body, k)?.try_matmul(&y.try_slice(-2, body, k)?)?)
}

impl Tensor {
    /// The sum over the last axis, in blocks of [`SUM_BLOCK`] whose partial sums are summed
    /// the same way, so no single loop sums more than [`SUM_SPLIT`] terms; a remainder that
    /// fills no block is summed on its own and added.
    fn blocked_sum_last(&self) -> Result<Tensor> {
        let Some((&n, lead)) = self.shape().split_last() else {
            return Err(shape_err("sum", "a 0-d tensor has no axis to sum"));
        };
        if n <= SUM_SPLIT {
            return self.try_reduce(ReduceOp::Add, -1, false, "sum");
        }
        let body = n - n % SUM_BLOCK;
        let blocks: Vec<usize> = lead.iter().copied().chain([body / SUM_BLOCK, SUM_BLOCK]).collect();
        let head = if body == n { self.clone() } else { self.try_slice(-1, 0, body)? };
        let partial = head.try_reshape(&blocks)?.try_reduce(ReduceOp::Add, -1, false, "sum")?;
        let total = partial.blocked_sum_last()?;
        if body == n {
            return Ok(total);
        }
        total.try_add(&self.try_slice(-1, body, n)?.try_reduce(ReduceOp::Add, -1, false, "sum")?)
    }

    pub(super) fn try_reduce(
        &self,
        op: ReduceOp,
        axis: isize,
        keepdim: bool,
        name: &'static str,
    ) -> Result<Tensor> {
        let a = self.axis(name, axis)?;
        if op == ReduceOp::Max && self.shape()[a] == 0 {
            return Err(shape_err(
                name,
                format!(
                    "axis {axis} of shape {:?} has size 0 (a maximum of nothing is undefined)",
                    self.shape()
                ),
            ));
        }
        if self.dtype().is_half() {
            // Accumulated in f32, rounded once at the end.
            let r = self.cast(DType::F32).try_reduce(op, axis, keepdim, name)?;
            return Ok(r.cast(self.dtype()));
        }
        let n = self.ndim();
        let x = if self.dtype() == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        if x.numel() == 0 {
            // Nothing to run: an empty result, or the sum over an empty axis, 0.
            let mut shape = self.shape().to_vec();
            if keepdim {
                shape[a] = 1;
            } else {
                shape.remove(a);
            }
            return Ok(if crate::util::numel(&shape) == 0 {
                Tensor::empty(&shape, x.dtype())
            } else {
                x.lit(0.0).filled_to(&shape)
            });
        }
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
    ///
    /// A float sum over more than 2^16 elements is taken in blocks of 4096 whose partial sums
    /// are summed in turn, so a long sum is as accurate as a short one (torch and numpy sum in
    /// blocks too): the ones of any length sum exactly up to f32's rounding of the count.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// assert_eq!(x.try_sum(0, false)?.to_ndarray::<f32>()?.as_slice(), Some(&[4.0, 6.0][..]));
    /// assert_eq!(x.try_sum(-1, true)?.shape(), [2, 1]);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `sum` when `axis` is out of range.
    pub fn try_sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.axis("sum", axis)?;
        let d = self.dtype();
        if self.shape()[a] <= SUM_SPLIT || d.is_int() {
            return self.try_reduce(ReduceOp::Add, axis, keepdim, "sum");
        }
        // As `try_reduce` does: 16-bit floats and bools are summed in f32, along the last axis.
        let x = if d.is_half() || d == DType::Bool { self.cast(DType::F32) } else { self.clone() };
        let n = x.ndim();
        let x = if a + 1 == n {
            x
        } else {
            x.try_permute(&(0..n).filter(|&k| k != a).chain([a]).collect::<Vec<_>>())?
        };
        let s = x.blocked_sum_last()?;
        let s = if keepdim {
            let mut shape = self.shape().to_vec();
            shape[a] = 1;
            s.try_reshape(&shape)?
        } else {
            s
        };
        Ok(if d.is_half() { s.cast(d) } else { s })
    }
    /// [`Tensor::try_sum`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_sum`] returns).
    #[track_caller]
    pub fn sum(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_sum(axis, keepdim))
    }
    /// Maximum over `axis`, keeping it as size 1 if `keepdim`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 3.0, 4.0], &[2, 2]);
    /// assert_eq!(x.try_max(1, false)?.to_ndarray::<f32>()?.as_slice(), Some(&[7.0, 4.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `max` when `axis` is out of range.
    pub fn try_max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.try_reduce(ReduceOp::Max, axis, keepdim, "max")
    }
    /// [`Tensor::try_max`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_max`] returns).
    #[track_caller]
    pub fn max(&self, axis: isize, keepdim: bool) -> Tensor {
        ok(self.try_max(axis, keepdim))
    }

    /// Matrix product with numpy's rules: `(.., n, k) @ (.., k, m) -> (.., n, m)`, the leading
    /// (batch) axes broadcast against each other; a 1-D operand is a vector (a row on the
    /// left, a column on the right) and its axis is dropped from the result. Computed as
    /// broadcast-multiply-reduce, `(.., n, m, k)` products summed over the last, contiguous
    /// axis, which the optimizer maps onto tile GEMMs (one per batch item and row block).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let id = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2]);
    /// assert_eq!(a.try_matmul(&id)?.to_ndarray::<f32>()?, a.to_ndarray::<f32>()?);
    /// assert!(a.try_matmul(&Tensor::full(&[3, 2], 1.0)).is_err());
    /// // A batch of three 2 x 2 matrices times one matrix, broadcast.
    /// let batch = Tensor::full(&[3, 2, 2], 1.0);
    /// assert_eq!(batch.try_matmul(&id)?.shape(), &[3, 2, 2]);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `matmul` when an operand is a
    /// scalar, the contracted sizes differ, the batch axes do not broadcast, the result has more
    /// than 2^40 elements, or the product more than 2^56 multiply-adds.
    pub fn try_matmul(&self, other: &Tensor) -> Result<Tensor> {
        /// The most multiply-adds one product may have: its indices stay far inside i64.
        const MAX_VIRTUAL_ELEMENTS: usize = 1 << 56;
        let (a, b) = (self.shape(), other.shape());
        let err = || shape_err("matmul", format!("cannot multiply {a:?} by {b:?}"));
        if a.is_empty() || b.is_empty() {
            return Err(err());
        }
        let d = promote(self.dtype(), other.dtype());
        if d.is_half() {
            // Products and their sum in f32 (a bf16 or f16 product is exact in f32), rounded
            // once. The tile GEMM of the 16-bit dtype sees through the widening and reads the
            // stored inputs in place.
            return Ok(self.cast(DType::F32).try_matmul(&other.cast(DType::F32))?.cast(d));
        }
        let product = || -> Result<Tensor> {
            // Vectors become matrices (1, k) and (k, 1); their axis is dropped at the end.
            let x = if a.len() == 1 { self.try_reshape(&[1, a[0]])? } else { self.clone() };
            let y = if b.len() == 1 { other.try_reshape(&[b[0], 1])? } else { other.clone() };
            let (sx, sy) = (x.shape().to_vec(), y.shape().to_vec());
            let (rx, ry) = (sx.len(), sy.len());
            let (n, k, m) = (sx[rx - 2], sx[rx - 1], sy[ry - 1]);
            if sy[ry - 2] != k {
                return Err(err());
            }
            let batch = crate::tensor::broadcast_shape(&sx[..rx - 2], &sy[..ry - 2]).ok_or_else(err)?;
            let with = |tail: &[usize]| -> Vec<usize> { batch.iter().chain(tail).copied().collect() };
            let out_shape = with(&[n, m]);
            crate::tensor::check_size("matmul", &out_shape)?;
            let product_shape = with(&[n, m, k]);
            // The (.., n, m, k) product is virtual (a tile GEMM or a loop nest sums it without
            // storing it), so only index arithmetic bounds it, not the tensor element limit.
            if crate::util::numel(&product_shape) > MAX_VIRTUAL_ELEMENTS {
                return Err(shape_err(
                    "matmul",
                    format!("the product {product_shape:?} has more than 2^56 multiply-adds"),
                ));
            }
            // Both operands in the promoted dtype (bool products count in f32), as `mul` would.
            let d = if d == DType::Bool { DType::F32 } else { d };
            let lift = |t: &Tensor, s: &[usize], mid: [usize; 3]| -> Result<Tensor> {
                let t = t.cast(d);
                // Leading 1s to the batch rank, then the middle axis to broadcast over.
                let ones = std::iter::repeat_n(1, batch.len() + 2 - s.len());
                let full: Vec<usize> = ones.chain(s[..s.len() - 2].iter().copied()).chain(mid).collect();
                let t = t.try_reshape(&full)?;
                Ok(Tensor { uop: UOp::new(Op::Expand(product_shape.clone()), d, vec![t.uop]) })
            };
            let xs = lift(&x, &sx, [n, 1, k])?;
            let yt = y.try_transpose(-1, -2)?;
            let ys = lift(&yt, &sy, [1, m, k])?;
            let prod = Tensor { uop: UOp::new(Op::Binary(uopc_ir::BinaryOp::Mul), d, vec![xs.uop, ys.uop]) };
            // One loop however long `k` is: the GEMM patterns are sums over `k` itself, and a
            // tile GEMM accumulates `k` in panels of its own. A product with one output column
            // (a matrix times a vector) may run as a plain loop instead, so a long `k` is cut
            // into blocks there; each block's rows still run as one GEMM.
            let out = if k > SUM_SPLIT && m == 1 {
                blocked_vector_product(&x, &y, k)?
            } else {
                prod.try_reduce(ReduceOp::Add, -1, false, "sum")?
            };
            let mut shape = with(&[n, m]);
            if b.len() == 1 {
                shape.pop();
            }
            if a.len() == 1 {
                shape.remove(shape.len() - if b.len() == 1 { 1 } else { 2 });
            }
            out.try_reshape(&shape)
        };
        product().map_err(|e| e.in_op("matmul"))
    }
    /// [`Tensor::try_matmul`], panicking on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not multiply (the error [`Tensor::try_matmul`] returns).
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        ok(self.try_matmul(other))
    }

    /// Softmax along `axis`: max-subtracted, with `exp` as `exp2` and log2(e) folded in.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).try_softmax(-1)?;
    /// let rows = p.sum(-1, false).to_ndarray::<f32>()?;
    /// assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-6));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `softmax` when `axis` is out of range.
    pub fn try_softmax(&self, axis: isize) -> Result<Tensor> {
        self.axis("softmax", axis)?;
        if self.dtype().is_half() {
            return Ok(self.via_f32(|x| x.softmax(axis)));
        }
        let softmax = || {
            let x = self.float();
            let m = x.try_max(axis, true)?;
            let e = (x.try_sub(&m)? * LOG2E as f32).exp2();
            // One loop per row (not the blocked long sum): the online row kernels recognize
            // this form and split long rows into chunks of their own.
            e.try_mul(&e.try_reduce(ReduceOp::Add, axis, true, "sum")?.recip())
        };
        softmax().map_err(|e| e.in_op("softmax"))
    }
    /// [`Tensor::try_softmax`], panicking on an invalid axis.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_softmax`] returns).
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        ok(self.try_softmax(axis))
    }
}
