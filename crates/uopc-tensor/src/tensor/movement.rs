//! Movement operations: views of the same elements in another shape or order, and joins.

use super::{Tensor, check_size, ok};
use crate::error::{Result, shape_err};
use crate::util::numel;
use uopc_ir::{DType, Op, UOp};

impl Tensor {
    /// The same elements viewed with another shape of the same element count.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]);
    /// assert_eq!(x.try_reshape(&[3, 2])?.shape(), [3, 2]);
    /// assert!(x.try_reshape(&[4]).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `reshape` when `shape` has another element
    /// count, more than 2^40 elements or an axis over 2^40 (also beside a zero-sized axis).
    pub fn try_reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_size("reshape", shape)?;
        if numel(shape) != self.numel() {
            return Err(shape_err("reshape", format!("cannot reshape {:?} to {shape:?}", self.shape())));
        }
        if shape == self.shape() {
            return Ok(self.clone());
        }
        // A reshape of a reshape is one reshape of the inner source.
        let base = match (self.uop.op(), self.uop.as_movement()) {
            (Op::Reshape(_), Some(inner)) => inner.clone(),
            _ => self.uop.clone(),
        };
        if base.shape() == shape {
            return Ok(Tensor { uop: base });
        }
        Ok(Tensor { uop: UOp::new(Op::Reshape(shape.to_vec()), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_reshape`], panicking on a size mismatch.
    ///
    /// # Panics
    ///
    /// On another element count (the error [`Tensor::try_reshape`] returns).
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Tensor {
        ok(self.try_reshape(shape))
    }

    /// Broadcast axes of size 1 to `shape` (same rank).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let row = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2]);
    /// let rows = row.try_expand(&[3, 2])?;
    /// assert_eq!(rows.sum(0, false).to_ndarray::<f32>()?.as_slice(), Some(&[3.0, 6.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `expand` when the ranks differ, an axis that
    /// is not 1 changes size (a size-1 axis may expand to 0, as numpy broadcasts), or `shape`
    /// has more than 2^40 elements or an axis over 2^40.
    pub fn try_expand(&self, shape: &[usize]) -> Result<Tensor> {
        let s = self.shape();
        if s.len() != shape.len() || s.iter().zip(shape).any(|(&a, &b)| a != b && a != 1) {
            return Err(shape_err("expand", format!("cannot expand {s:?} to {shape:?}")));
        }
        check_size("expand", shape)?;
        if s == shape {
            return Ok(self.clone());
        }
        let base = self.uop.as_expand().unwrap_or(&self.uop).clone();
        Ok(Tensor { uop: UOp::new(Op::Expand(shape.to_vec()), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_expand`], panicking on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that do not expand (the error [`Tensor::try_expand`] returns).
    #[track_caller]
    pub fn expand(&self, shape: &[usize]) -> Tensor {
        ok(self.try_expand(shape))
    }

    /// numpy's `broadcast_to`: new leading axes, then size-1 axes stretched.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `broadcast_to` when `self` has more axes than
    /// `shape` or an axis that is neither 1 nor `shape`'s.
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
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::full(&[2, 3, 4], 0.0);
    /// assert_eq!(x.try_permute(&[2, 0, 1])?.shape(), [4, 2, 3]);
    /// assert!(x.try_permute(&[0, 0, 1]).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `permute` when `perm` is not a permutation of
    /// `0..ndim`.
    pub fn try_permute(&self, perm: &[usize]) -> Result<Tensor> {
        let n = self.ndim();
        let mut seen = vec![false; n];
        if perm.len() != n || perm.iter().any(|&p| p >= n || std::mem::replace(&mut seen[p], true)) {
            return Err(shape_err(
                "permute",
                format!("{perm:?} is not a permutation of the axes of {:?}", self.shape()),
            ));
        }
        let (base, perm) = match (self.uop.op(), self.uop.as_movement()) {
            (Op::Permute(inner), Some(viewed)) => {
                (viewed.clone(), perm.iter().map(|&p| inner[p]).collect::<Vec<_>>())
            }
            _ => (self.uop.clone(), perm.to_vec()),
        };
        if perm.iter().enumerate().all(|(k, &p)| k == p) {
            return Ok(Tensor { uop: base });
        }
        Ok(Tensor { uop: UOp::new(Op::Permute(perm), self.dtype(), vec![base]) })
    }
    /// [`Tensor::try_permute`], panicking on an invalid permutation.
    ///
    /// # Panics
    ///
    /// On an invalid permutation (the error [`Tensor::try_permute`] returns).
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Tensor {
        ok(self.try_permute(perm))
    }

    /// Axes `a` and `b` swapped (negative axes count from the end).
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    /// let xt = x.try_transpose(0, -1)?;
    /// assert_eq!(xt.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 4.0, 2.0, 5.0, 3.0, 6.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `transpose` when an axis is out of range.
    pub fn try_transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (self.axis("transpose", a)?, self.axis("transpose", b)?);
        let mut perm: Vec<usize> = (0..self.ndim()).collect();
        perm.swap(a, b);
        self.try_permute(&perm)
    }
    /// [`Tensor::try_transpose`], panicking on invalid axes.
    ///
    /// # Panics
    ///
    /// On an axis out of range (the error [`Tensor::try_transpose`] returns).
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Tensor {
        ok(self.try_transpose(a, b))
    }
    /// The last two axes swapped (`T` of a matrix); panics on fewer than two axes.
    ///
    /// # Panics
    ///
    /// When the tensor has fewer than two axes.
    #[track_caller]
    pub fn t(&self) -> Tensor {
        ok(self.try_transpose(-2, -1).map_err(|e| e.in_op("t")))
    }

    /// Each axis restricted to `begin..end`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `shrink` when there is not one bound per axis
    /// or a bound is reversed (`begin > end`) or reaches past its axis; an empty bound gives an
    /// empty result.
    pub fn try_shrink(&self, bounds: &[(usize, usize)]) -> Result<Tensor> {
        let s = self.shape();
        if bounds.len() != s.len() || bounds.iter().zip(s).any(|(&(b, e), &n)| b > e || e > n) {
            return Err(shape_err("shrink", format!("bounds {bounds:?} do not fit shape {s:?}")));
        }
        if bounds.iter().zip(s).all(|(&(b, e), &n)| b == 0 && e == n) {
            return Ok(self.clone());
        }
        Ok(Tensor { uop: UOp::new(Op::Shrink(bounds.to_vec()), self.dtype(), vec![self.uop.clone()]) })
    }
    /// [`Tensor::try_shrink`], panicking on bounds that do not fit.
    ///
    /// # Panics
    ///
    /// On bounds that do not fit (the error [`Tensor::try_shrink`] returns).
    #[track_caller]
    pub fn shrink(&self, bounds: &[(usize, usize)]) -> Tensor {
        ok(self.try_shrink(bounds))
    }
    /// `begin..end` along one axis.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]);
    /// let tail = x.try_slice(-1, 1, 3)?;
    /// assert_eq!(tail.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 2.0, 4.0, 5.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `slice` when the axis is out of range or
    /// `begin..end` is reversed or reaches past it.
    pub fn try_slice(&self, axis: isize, begin: usize, end: usize) -> Result<Tensor> {
        let a = self.axis("slice", axis)?;
        let mut b: Vec<(usize, usize)> = self.shape().iter().map(|&n| (0, n)).collect();
        b[a] = (begin, end);
        self.try_shrink(&b).map_err(|_| {
            shape_err("slice", format!("{begin}..{end} does not fit axis {axis} of shape {:?}", self.shape()))
        })
    }
    /// [`Tensor::try_slice`], panicking on bounds that do not fit.
    ///
    /// # Panics
    ///
    /// On bounds that do not fit (the error [`Tensor::try_slice`] returns).
    #[track_caller]
    pub fn slice(&self, axis: isize, begin: usize, end: usize) -> Tensor {
        ok(self.try_slice(axis, begin, end))
    }

    /// Tensors of one shape stacked along a new axis `axis`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let (a, b) = (Tensor::full(&[2], 1.0), Tensor::full(&[2], 2.0));
    /// let s = Tensor::try_stack(&[&a, &b], 1)?;
    /// assert_eq!(s.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 2.0, 1.0, 2.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `stack` when there are no tensors, their
    /// shapes differ, `axis` is out of range for the stacked rank, or the stack would have more
    /// than 2^40 elements.
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
        let mut stacked_shape = shape.to_vec();
        stacked_shape.insert(0, tensors.len());
        check_size("stack", &stacked_shape)?;
        let d = tensors.iter().map(|t| t.dtype()).fold(first.dtype(), DType::max);
        let src: Vec<UOp> = tensors.iter().map(|t| t.cast(d).uop).collect();
        let stacked = Tensor { uop: UOp::new(Op::Stack, d, src) };
        let mut perm: Vec<usize> = (1..n as usize).collect();
        perm.insert(a as usize, 0);
        stacked.try_permute(&perm)
    }
    /// [`Tensor::try_stack`], panicking on differing shapes.
    ///
    /// # Panics
    ///
    /// On differing shapes or an axis out of range (the error [`Tensor::try_stack`] returns).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], axis: isize) -> Tensor {
        ok(Tensor::try_stack(tensors, axis))
    }

    /// Tensors concatenated along `axis`. Built from SHRINK, STACK and RESHAPE: every input is
    /// cut into chunks of the gcd of the sizes along `axis`, the chunks are stacked and the
    /// stack axis is merged into `axis`. Sizes whose gcd would make more than 16 chunks (1000
    /// and 1 make 1001) are joined by a WHERE per input instead, each element then choosing
    /// among the inputs rather than among the chunks.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let (a, b) = (Tensor::full(&[1, 2], 1.0), Tensor::full(&[2, 2], 2.0));
    /// let c = Tensor::try_cat(&[&a, &b], 0)?;
    /// assert_eq!(c.shape(), [3, 2]);
    /// assert_eq!(c.sum(1, false).to_ndarray::<f32>()?.as_slice(), Some(&[2.0, 4.0, 4.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `cat` when there are no tensors, `axis` is
    /// out of range, the shapes differ outside `axis`, or the result would have more than 2^40
    /// elements.
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
        let mut shape = first.shape().to_vec();
        shape[a] = tensors
            .iter()
            .try_fold(0usize, |n, t| n.checked_add(t.shape()[a]))
            .ok_or_else(|| shape_err("cat", format!("the sizes along axis {axis} overflow")))?;
        check_size("cat", &shape)?;
        if crate::util::numel(&shape) == 0 {
            let d = tensors.iter().map(|t| t.dtype()).fold(first.dtype(), DType::max);
            return Ok(Tensor::empty(&shape, d));
        }
        // Parts empty along `axis` contribute nothing (and would make the gcd below 0).
        let tensors: Vec<&Tensor> = tensors.iter().copied().filter(|t| t.shape()[a] > 0).collect();
        if tensors.len() == 1 {
            return Ok(tensors[0].clone());
        }
        fn gcd(a: usize, b: usize) -> usize {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let g = tensors.iter().fold(0, |g, t| gcd(g, t.shape()[a]));
        if shape[a] / g > CAT_MAX_STACKED_CHUNKS {
            return cat_by_selection(&tensors, a, &shape).map_err(|e| e.in_op("cat"));
        }
        let mut chunks = Vec::new();
        for t in tensors {
            for c in 0..t.shape()[a] / g {
                chunks.push(t.try_slice(a as isize, c * g, (c + 1) * g)?);
            }
        }
        let refs: Vec<&Tensor> = chunks.iter().collect();
        let stacked = Tensor::try_stack(&refs, a as isize)?; // (.., C, g, ..)
        stacked.try_reshape(&shape)
    }
    /// [`Tensor::try_cat`], panicking on incompatible shapes.
    ///
    /// # Panics
    ///
    /// On shapes that differ outside `axis` (the error [`Tensor::try_cat`] returns).
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Tensor {
        ok(Tensor::try_cat(tensors, axis))
    }
}

/// Chunks [`Tensor::try_cat`] stacks at most; past it an element would choose among so many
/// chunks (one select each) that choosing among the inputs is cheaper.
const CAT_MAX_STACKED_CHUNKS: usize = 16;

/// `parts` (non-empty along axis `a`, at least two) concatenated along `a` into `shape`: each
/// part viewed over the whole axis ([`repeated_over`]) and, from the last part back, a WHERE
/// on the position along `a` choosing the part it falls in. Each element selects among the
/// parts, not among chunks of their gcd.
fn cat_by_selection(parts: &[&Tensor], a: usize, shape: &[usize]) -> Result<Tensor> {
    let total = shape[a];
    let d = parts.iter().map(|t| t.dtype()).fold(parts[0].dtype(), DType::max);
    let mut along = vec![1; shape.len()];
    along[a] = total;
    let position = Tensor::arange(total).try_reshape(&along)?;
    let mut end = total;
    let mut joined: Option<Tensor> = None;
    for part in parts.iter().rev() {
        let start = end - part.shape()[a];
        let view = repeated_over(&part.cast(d), a, start, total)?;
        joined = Some(match joined {
            None => view,
            Some(after) => position.try_lt(&position.lit(end as f64))?.try_where(&view, &after)?,
        });
        end = start;
    }
    joined.ok_or_else(|| shape_err("cat", "needs at least one tensor"))
}

/// `t` repeated along axis `a` (EXPAND of a new axis, merged by RESHAPE) and cut (SHRINK) to
/// `total` positions, so that position `i` holds `t`'s element `(i - start) mod n` (`n` its
/// size along `a`): `t` itself at positions `start .. start + n`, and every position in bounds.
fn repeated_over(t: &Tensor, a: usize, start: usize, total: usize) -> Result<Tensor> {
    let n = t.shape()[a];
    let offset = (n - start % n) % n;
    let copies = (offset + total).div_ceil(n);
    let mut one = t.shape().to_vec();
    one.insert(a, 1);
    let mut many = one.clone();
    many[a] = copies;
    let mut merged = t.shape().to_vec();
    merged[a] = copies * n;
    t.try_reshape(&one)?.try_expand(&many)?.try_reshape(&merged)?.try_slice(
        a as isize,
        offset,
        offset + total,
    )
}
