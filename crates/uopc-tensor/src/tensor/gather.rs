//! Selection by a tensor of indices: `index_select` (torch's: one index per position along an
//! axis) and `gather` (torch's: one index per output element), each a hand-written loop kernel
//! whose gradient is a scatter-add kernel, whose gradient in turn is the selection (so
//! derivatives of any order exist).
//!
//! The indices are data, so no compile-time proof can keep them in bounds. They are realized
//! and checked on the host when the op is built (an out-of-range index is an error naming the
//! op and the index's position), and the kernel clamps each index it loads into the axis, so
//! the verifier proves every load and store in bounds; the clamp never changes a checked
//! index, it only makes the proof possible.

use super::Tensor;
use super::custom::CustomVjp;
use crate::error::{Result, TensorError, shape_err};
use crate::util::{dense_strides, numel};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use uopc_ir::{AxisType, CustomKernel, DType, DataRef, HostBuffer, Op, UOp, buffer, idx, range, sink};

/// Which selection a kernel makes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    /// `index_select`: output position `p` reads index `indices[p[axis]]`.
    Select,
    /// `gather`: output position `p` reads index `indices[p]` (the indices have the output's
    /// shape).
    Gather,
}

impl Kind {
    fn op(self) -> &'static str {
        match self {
            Kind::Select => "index_select",
            Kind::Gather => "gather",
        }
    }
    fn backward_name(self) -> &'static str {
        match self {
            Kind::Select => "index_select_backward",
            Kind::Gather => "gather_backward",
        }
    }
}

/// The geometry of one selection: the source's shape, the output's (which the kernels iterate
/// over, and which the cotangent has), and the axis the indices replace.
struct Selection {
    kind: Kind,
    src: Vec<usize>,
    out: Vec<usize>,
    axis: usize,
}

/// Row-major strides of `shape`, in elements, as index constants.
fn strides(shape: &[usize]) -> Vec<i64> {
    dense_strides(shape).into_iter().map(|s| s as i64).collect()
}

/// `sum_k terms[k] * strides[k]`, as an index expression.
fn dot(terms: &[UOp], strides: &[i64]) -> UOp {
    terms.iter().zip(strides).fold(idx(0), |acc, (t, &s)| acc + &(t * s))
}

/// `v` limited to `0..len` (`len >= 1`) with MAX and NEG only, the forms whose bounds the
/// verifier derives: `-max(-max(v, 0), -(len - 1))` lies in `0..=len - 1` whatever `v` is.
fn clamp_index(v: &UOp, len: usize) -> UOp {
    debug_assert!(len >= 1);
    let floor = v.maximum(0i64);
    -(-floor).maximum(-(len as i64 - 1))
}

impl Selection {
    /// The number of indices the kernels read.
    fn index_len(&self) -> usize {
        match self.kind {
            Kind::Select => self.out[self.axis],
            Kind::Gather => numel(&self.out),
        }
    }

    /// One LOOP range per output axis, ids `0..ndim`.
    fn ranges(&self) -> Vec<UOp> {
        self.out.iter().enumerate().map(|(k, &n)| range(n, k, AxisType::Loop)).collect()
    }

    /// The (clamped) index the output position `r` selects, read from `indices`.
    fn index_at(&self, indices: &UOp, r: &[UOp]) -> UOp {
        let at = match self.kind {
            Kind::Select => r[self.axis].clone(),
            Kind::Gather => dot(r, &strides(&self.out)),
        };
        clamp_index(&indices.index(at).load().cast(DType::INDEX), self.src[self.axis])
    }

    /// The source element that output position `r` reads: its own coordinates, with `j` on the
    /// axis (`r[k] < src[k]` off the axis, as the shape checks ensure).
    fn source_at(&self, r: &[UOp], j: &UOp) -> UOp {
        let mut at = r.to_vec();
        at[self.axis] = j.clone();
        dot(&at, &strides(&self.src))
    }

    /// `out[p] = src[source_at(p, indices at p)]` over every output position.
    fn gather_program(&self, dtype: DType, index_dtype: DType) -> UOp {
        let src = buffer(0, dtype, numel(&self.src));
        let indices = buffer(1, index_dtype, self.index_len());
        let out = buffer(2, dtype, numel(&self.out));
        let r = self.ranges();
        let j = self.index_at(&indices, &r);
        let store = out.index(dot(&r, &strides(&self.out))).store(src.index(self.source_at(&r, &j)).load());
        let innermost_first: Vec<UOp> = r.iter().rev().cloned().collect();
        sink(&[store.end(&innermost_first)])
    }

    /// The gradient of the selection: `grad[source_at(p)] += cot[p]` over every output position
    /// in order, after zeroing `grad` (sequential, since two positions may select one element).
    fn scatter_add_program(&self, dtype: DType, index_dtype: DType) -> UOp {
        let cot = buffer(0, dtype, numel(&self.out));
        let indices = buffer(1, index_dtype, self.index_len());
        let grad = buffer(2, dtype, numel(&self.src));
        let z = range(numel(&self.src), self.out.len(), AxisType::Loop);
        let zeroed = grad.index(&z).store(0.0).end(&[z]);
        let r = self.ranges();
        let j = self.index_at(&indices, &r);
        let mut deps = vec![zeroed];
        deps.extend(r.iter().cloned());
        let grad_r = grad.after(&deps);
        let at = self.source_at(&r, &j);
        let cot_p = cot.index(dot(&r, &strides(&self.out))).load();
        let store = grad_r.index(&at).store(grad_r.index(&at).load() + cot_p);
        let innermost_first: Vec<UOp> = r.iter().rev().cloned().collect();
        sink(&[store.end(&innermost_first)])
    }

    /// The selection of `src` by `indices` (realized and checked), as a kernel node whose
    /// gradient rule is the scatter-add.
    fn gather(&self, src: &Tensor, indices: &Tensor) -> Result<Tensor> {
        let d = src.dtype();
        if numel(&self.out) == 0 {
            return Ok(Tensor::empty(&self.out, d));
        }
        let program = self.gather_program(d, indices.dtype());
        let node = Tensor::try_custom(self.kind.op(), program, &[src, indices], &self.out, d, None)?;
        Ok(with_rule(&node, shared_vjp(self.kind, self.axis, Pass::Forward)))
    }

    /// The cotangent of the source from the output's cotangent `cot`, by the scatter-add
    /// kernel (16-bit cotangents accumulate in f32 and are rounded once at the end), as a node
    /// whose own gradient rule is the selection again (so second derivatives exist).
    fn scatter_add(&self, cot: &Tensor, indices: &Tensor) -> Result<Tensor> {
        let d = cot.dtype();
        if d.is_half() {
            return Ok(self.scatter_add(&cot.cast(DType::F32), indices)?.cast(d));
        }
        if !d.is_float() {
            return Err(TensorError::DType {
                op: self.kind.op(),
                msg: format!("no gradient flows through a {d} selection"),
            });
        }
        if numel(&self.out) == 0 {
            return Tensor::try_full_dtype(&self.src, 0, d);
        }
        let program = self.scatter_add_program(d, indices.dtype());
        let node =
            Tensor::try_custom(self.kind.backward_name(), program, &[cot, indices], &self.src, d, None)?;
        Ok(with_rule(&node, shared_vjp(self.kind, self.axis, Pass::Backward)))
    }
}

/// Which kernel of a selection a gradient rule belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Pass {
    /// The selection (sources: the tensor, the indices); its gradient is the scatter-add.
    Forward,
    /// The scatter-add (sources: the cotangent, the indices); its gradient is the selection.
    Backward,
}

/// `node` (a custom kernel node) with `rule` as its gradient rule.
fn with_rule(node: &Tensor, rule: DataRef) -> Tensor {
    let Op::Custom(kernel) = node.uop().op() else { unreachable!("try_custom builds a custom node") };
    let kernel = CustomKernel { vjp: Some(rule), ..kernel.clone() };
    Tensor::from_uop(UOp::new(Op::Custom(kernel), node.dtype(), node.uop().src().to_vec()))
}

/// What a shared gradient rule is for: the selection's kind, its axis, and the kernel.
type RuleKey = (Kind, usize, Pass);

/// The gradient rule of the `pass` kernels of the selections of `kind` along `axis`, one
/// shared value per triple: a custom kernel's rule is part of its node (compared by identity),
/// so a fresh rule per call would make every call a new plan to compile.
fn shared_vjp(kind: Kind, axis: usize, pass: Pass) -> DataRef {
    static RULES: LazyLock<Mutex<HashMap<RuleKey, DataRef>>> = LazyLock::new(Default::default);
    let mut rules = RULES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    rules
        .entry((kind, axis, pass))
        .or_insert_with(|| {
            let rule: Arc<CustomVjp> = Arc::new(move |sources: &[Tensor], out: &Tensor, cot: &Tensor| {
                // sources[1] holds the indices in both passes; the selection's source shape is
                // the forward source's, or the scatter-add's output.
                let (src, selected) = match pass {
                    Pass::Forward => (sources[0].shape(), out.shape()),
                    Pass::Backward => (out.shape(), sources[0].shape()),
                };
                let sel = Selection { kind, src: src.to_vec(), out: selected.to_vec(), axis };
                let grad = match pass {
                    Pass::Forward => sel.scatter_add(cot, &sources[1])?,
                    Pass::Backward => sel.gather(cot, &sources[1])?,
                };
                Ok(vec![Some(grad), None])
            });
            DataRef(Arc::new(rule))
        })
        .clone()
}

/// The indices realized (if they are not yet) and their values, checked to be integers.
fn realized_indices(op: &'static str, indices: &Tensor) -> Result<(Tensor, Vec<i64>)> {
    let d = indices.dtype();
    if !d.is_int() {
        return Err(TensorError::DType { op, msg: format!("indices are {d}; they must be i32 or i64") });
    }
    let t = if indices.is_realized() { indices.clone() } else { indices.realize()? };
    let values = match t.host_data() {
        Some(HostBuffer::I32(v)) => v.iter().map(|&i| i64::from(i)).collect(),
        Some(HostBuffer::I64(v)) => v.clone(),
        _ => unreachable!("a realized integer tensor holds an i32 or i64 host buffer"),
    };
    Ok((t, values))
}

/// The row-major coordinates of flat position `p` in `shape`.
fn unravel(mut p: usize, shape: &[usize]) -> Vec<usize> {
    let mut at = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        at[k] = p % shape[k];
        p /= shape[k];
    }
    at
}

impl Tensor {
    /// The elements of this tensor at positions `indices` along `axis` (torch's
    /// `index_select`): `out[.., i, ..] = self[.., indices[i], ..]`, of this tensor's shape with
    /// `axis` replaced by `indices.len()` (a 0-d `indices` counts as one). Any dtype; repeats
    /// allowed; gradients flow to this tensor (a scatter-add: repeated indices add up).
    ///
    /// `indices` is an i32 or i64 tensor and may be computed: it is realized (with the default
    /// options) and checked on the host when this op is built, because its values decide
    /// which elements are read. The selection itself is a kernel of the lazy graph.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    /// let cols = Tensor::from_vec(vec![2i64, 0, 2], &[3]);
    /// let picked = x.try_index_select(1, &cols)?;
    /// assert_eq!(picked.to_ndarray::<f64>()?.as_slice(), Some(&[3.0, 1.0, 3.0, 6.0, 4.0, 6.0][..]));
    /// assert!(x.try_index_select(0, &Tensor::from_vec(vec![2i32], &[1])).is_err());
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Naming `index_select`: [`TensorError::Shape`] when `axis` is out of range or `indices`
    /// has more than one axis, or an index is negative or not below the axis's length (the
    /// message names its position; torch rejects negative indices here too);
    /// [`TensorError::DType`] when `indices` is not an integer tensor; and the errors of
    /// realizing `indices`.
    pub fn try_index_select(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        let op = Kind::Select.op();
        let axis = self.axis(op, axis)?;
        if indices.ndim() > 1 {
            return Err(shape_err(op, format!("indices have shape {:?}; they must be 1-d", indices.shape())));
        }
        let mut out = self.shape().to_vec();
        out[axis] = indices.numel();
        let sel = Selection { kind: Kind::Select, src: self.shape().to_vec(), out, axis };
        let flat = if indices.ndim() == 0 { indices.reshape(&[1]) } else { indices.clone() };
        self.select_by(sel, indices, &flat)
    }

    /// [`Tensor::try_index_select`], panicking on an error.
    ///
    /// # Panics
    ///
    /// On the errors [`Tensor::try_index_select`] returns.
    #[track_caller]
    pub fn index_select(&self, axis: isize, indices: &Tensor) -> Tensor {
        super::ok(self.try_index_select(axis, indices))
    }

    /// The elements of this tensor picked along `axis` by an index per output element (torch's
    /// `gather`): `out[p] = self[p with p[axis] replaced by indices[p]]`, of the shape of
    /// `indices`, which has as many axes as this tensor and no axis longer than this tensor's
    /// except `axis`. Any dtype; gradients flow to this tensor (a scatter-add).
    ///
    /// `indices` is an i32 or i64 tensor and may be computed: it is realized (with the default
    /// options) and checked on the host when this op is built.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let idx = Tensor::from_vec(vec![0i64, 0, 1, 0], &[2, 2]);
    /// let g = x.try_gather(1, &idx)?; // [[x00, x00], [x11, x10]]
    /// assert_eq!(g.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 1.0, 4.0, 3.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Naming `gather`: [`TensorError::Shape`] when this tensor is 0-d, `axis` is out of range,
    /// `indices` has another number of axes or an axis (other than `axis`) longer than this
    /// tensor's, or an index is negative or not below the axis's length (the message names its
    /// position); [`TensorError::DType`] when `indices` is not an integer tensor; and the
    /// errors of realizing `indices`.
    pub fn try_gather(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        let op = Kind::Gather.op();
        let axis = self.axis(op, axis)?;
        let (src, index) = (self.shape(), indices.shape());
        let fits = index.len() == src.len() && (0..src.len()).all(|k| k == axis || index[k] <= src[k]);
        if !fits {
            return Err(shape_err(
                op,
                format!(
                    "indices of shape {index:?} do not fit a tensor of shape {src:?} along axis {axis} \
                     (they need {} axes, none but axis {axis} longer than the tensor's)",
                    src.len()
                ),
            ));
        }
        let sel = Selection { kind: Kind::Gather, src: src.to_vec(), out: index.to_vec(), axis };
        self.select_by(sel, indices, indices)
    }

    /// [`Tensor::try_gather`], panicking on an error.
    ///
    /// # Panics
    ///
    /// On the errors [`Tensor::try_gather`] returns.
    #[track_caller]
    pub fn gather(&self, axis: isize, indices: &Tensor) -> Tensor {
        super::ok(self.try_gather(axis, indices))
    }

    /// The selection `sel` of this tensor by `indices` (as the user gave them, for messages)
    /// laid out as the kernel reads them (`flat`).
    fn select_by(&self, sel: Selection, indices: &Tensor, flat: &Tensor) -> Result<Tensor> {
        let op = sel.kind.op();
        let (realized, values) = realized_indices(op, flat)?;
        let len = sel.src[sel.axis];
        if let Some((p, &v)) = values.iter().enumerate().find(|&(_, &v)| v < 0 || v as u64 >= len as u64) {
            let at =
                if indices.ndim() > 1 { format!("{:?}", unravel(p, indices.shape())) } else { p.to_string() };
            return Err(shape_err(
                op,
                format!("indices[{at}] = {v} is outside 0..{len}, the length of axis {}", sel.axis),
            ));
        }
        sel.gather(self, &realized)
    }
}
