//! Random tensor graphs for differential tests and fuzzing: any byte string decodes into a
//! valid graph of small tensors of rank 0 to 4 (elementwise ops with numpy broadcasting,
//! reductions, softmax, movement ops, and matmuls including 1-D and batch-broadcast operands),
//! whose f64 reference value is computed with ndarray alongside, independently of uopc.
//! [`check`] realizes a graph under several [`RealizeOptions`](uopc_tensor::RealizeOptions)
//! and compares each result with the reference and with the others.
//!
//! The decoder never fails: when the bytes run out it reads zeros, and an op that does not fit
//! the tensor at hand (a reduction of a scalar, a product that would grow too large) is
//! skipped. So a proptest strategy over byte vectors shrinks towards small graphs, and every
//! input a fuzzer makes is a test.

#![warn(missing_docs)]

use ndarray::{ArrayD, Axis, IxDyn, Slice};
use uopc_tensor::Tensor;

mod check;
pub use check::{check, check_try_api, options};

/// The largest axis of a decoded tensor. Axes of 1 are drawn often: they are where broadcasts,
/// vectors and one-element loops meet.
const MAX_AXIS: usize = 5;
/// The most elements of one node, and of one matmul's virtual product (`output * k`).
const MAX_ELEMENTS: usize = 256;
const MAX_PRODUCT: usize = 2048;
/// Results beyond this magnitude are refused, so tolerances stay meaningful.
const MAX_MAGNITUDE: f64 = 1e6;
/// The most ops one graph applies.
const MAX_STEPS: usize = 14;

/// A byte source that reads zeros when exhausted.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    /// A value below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n.max(1)
    }
    fn flag(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// One op of a graph; operands are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf tensor with these values (row-major).
    Leaf(Vec<f32>),
    /// `a + b`, `a - b`, `a * b`, `maximum(a, b)`, broadcast like numpy.
    Add(usize, usize),
    /// See [`Op::Add`].
    Sub(usize, usize),
    /// See [`Op::Add`].
    Mul(usize, usize),
    /// See [`Op::Add`].
    Maximum(usize, usize),
    /// `-a`.
    Neg(usize),
    /// `exp(a * scale)`, the scale chosen so that the argument stays within [-1, 1].
    Exp(usize, f32),
    /// `a.sum(axis, keepdim)`.
    Sum(usize, usize, bool),
    /// `a.max(axis, keepdim)`.
    Max(usize, usize, bool),
    /// `a.softmax(axis)`.
    Softmax(usize, usize),
    /// `a.matmul(b)` (numpy's matmul: 1-D operands, broadcast batch axes).
    Matmul(usize, usize),
    /// `a.permute(perm)`.
    Permute(usize, Vec<usize>),
    /// `a.reshape(shape)`.
    Reshape(usize, Vec<usize>),
    /// `a.expand(shape)` (same rank; axes of 1 grow).
    Expand(usize, Vec<usize>),
    /// `a.slice(axis, begin, end)`.
    Slice(usize, usize, usize, usize),
    /// `cat([a, b], axis)`.
    Cat(usize, usize, usize),
}

impl Op {
    /// The nodes it reads.
    pub fn operands(&self) -> Vec<usize> {
        match *self {
            Op::Leaf(_) => Vec::new(),
            Op::Add(a, b) | Op::Sub(a, b) | Op::Mul(a, b) | Op::Maximum(a, b) | Op::Matmul(a, b) => {
                vec![a, b]
            }
            Op::Cat(a, b, _) => vec![a, b],
            Op::Neg(a)
            | Op::Exp(a, _)
            | Op::Sum(a, ..)
            | Op::Max(a, ..)
            | Op::Softmax(a, _)
            | Op::Permute(a, _)
            | Op::Reshape(a, _)
            | Op::Expand(a, _)
            | Op::Slice(a, ..) => vec![a],
        }
    }
}

/// A node: its op, its shape and its f64 reference value.
#[derive(Clone, Debug)]
pub struct Node {
    /// What computes it.
    pub op: Op,
    /// Its shape (rank 0 to 4).
    pub shape: Vec<usize>,
    /// Its value, computed in f64 from the leaves' f32 values.
    pub value: ArrayD<f64>,
    /// The largest magnitude of its value, or of a sum of magnitudes of terms it adds up.
    pub magnitude: f64,
}

/// A decoded graph: nodes in order (each op's operands come before it); the last is the root.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The nodes, sources first.
    pub nodes: Vec<Node>,
    /// The largest magnitude any node's value or any sum of magnitudes inside a reduction or
    /// product reaches: the f32 rounding errors of a realization scale with it.
    pub magnitude: f64,
}

impl Graph {
    /// The root node (the last one).
    pub fn root(&self) -> &Node {
        self.nodes.last().expect("a decoded graph has at least one node")
    }

    /// The graph built as a lazy [`Tensor`] (the root's).
    pub fn tensor(&self) -> Tensor {
        let mut built: Vec<Tensor> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let t = |i: &usize| &built[*i];
            let ax = |a: &usize| *a as isize;
            let out = match &node.op {
                Op::Leaf(values) => Tensor::from_vec(values.clone(), &node.shape),
                Op::Add(a, b) => t(a) + t(b),
                Op::Sub(a, b) => t(a) - t(b),
                Op::Mul(a, b) => t(a) * t(b),
                Op::Maximum(a, b) => t(a).maximum(t(b)),
                Op::Neg(a) => -t(a),
                Op::Exp(a, scale) => (t(a) * *scale).exp(),
                Op::Sum(a, axis, keep) => t(a).sum(ax(axis), *keep),
                Op::Max(a, axis, keep) => t(a).max(ax(axis), *keep),
                Op::Softmax(a, axis) => t(a).softmax(ax(axis)),
                Op::Matmul(a, b) => t(a).matmul(t(b)),
                Op::Permute(a, perm) => t(a).permute(perm),
                Op::Reshape(a, shape) => t(a).reshape(shape),
                Op::Expand(a, shape) => t(a).expand(shape),
                Op::Slice(a, axis, begin, end) => t(a).slice(ax(axis), *begin, *end),
                Op::Cat(a, b, axis) => Tensor::cat(&[t(a), t(b)], ax(axis)),
            };
            debug_assert_eq!(out.shape(), &node.shape[..], "{:?}", node.op);
            built.push(out);
        }
        built.pop().expect("a decoded graph has at least one node")
    }
}

/// numpy's broadcast of two shapes, if they broadcast.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], k: usize| if k + s.len() < r { 1 } else { s[k + s.len() - r] };
    (0..r)
        .map(|k| match (at(a, k), at(b, k)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `x` broadcast to `shape` (numpy rules), as an owned array.
fn broadcast_to(x: &ArrayD<f64>, shape: &[usize]) -> ArrayD<f64> {
    x.broadcast(IxDyn(shape)).expect("shapes broadcast").to_owned()
}

/// numpy's matmul in f64 loops, and per element the sum of the magnitudes of its terms.
fn matmul_f64(a: &ArrayD<f64>, b: &ArrayD<f64>) -> (ArrayD<f64>, f64) {
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let xa = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
    let xb = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
    let (ra, rb) = (xa.len(), xb.len());
    let (n, k, m) = (xa[ra - 2], xa[ra - 1], xb[rb - 1]);
    let batch = broadcast(&xa[..ra - 2], &xb[..rb - 2]).expect("batches broadcast");
    // Each operand broadcast to the full batch, as (items, rows, cols).
    let full = |x: &ArrayD<f64>, s: &[usize], tail: [usize; 2]| {
        let x = x.to_shape(IxDyn(s)).expect("same size").to_owned();
        let x = broadcast_to(&x, &[&batch[..], &tail[..]].concat());
        let items = numel(&batch);
        x.as_standard_layout().to_owned().into_shape_with_order(IxDyn(&[items, tail[0], tail[1]])).unwrap()
    };
    let (fa, fb) = (full(a, &xa, [n, k]), full(b, &xb, [k, m]));
    let items = numel(&batch);
    let mut out = Vec::with_capacity(items * n * m);
    let mut magnitude: f64 = 0.0;
    for item in 0..items {
        for i in 0..n {
            for j in 0..m {
                let terms = (0..k).map(|p| fa[[item, i, p]] * fb[[item, p, j]]);
                let (s, g) = terms.fold((0.0, 0.0), |(s, g), t| (s + t, g + f64::abs(t)));
                out.push(s);
                magnitude = magnitude.max(g);
            }
        }
    }
    let mut shape: Vec<usize> = batch.iter().copied().chain([n, m]).collect();
    if sb.len() == 1 {
        shape.pop();
    }
    if sa.len() == 1 {
        let at = shape.len() - if sb.len() == 1 { 1 } else { 2 };
        shape.remove(at);
    }
    (ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap(), magnitude)
}

fn max_abs(x: &ArrayD<f64>) -> f64 {
    x.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// The decoder's state: the nodes so far and a stack of candidates for the next op.
struct Decoder<'a> {
    bytes: Bytes<'a>,
    nodes: Vec<Node>,
    stack: Vec<usize>,
    /// The state of the leaves' value generator (xorshift), seeded from the bytes.
    seed: u64,
}

impl Decoder<'_> {
    fn push(&mut self, op: Op, value: ArrayD<f64>, inner_magnitude: f64) -> Option<usize> {
        let m = max_abs(&value).max(inner_magnitude);
        if !m.is_finite() || m > MAX_MAGNITUDE || value.len() > MAX_ELEMENTS || value.ndim() > 4 {
            return None;
        }
        let shape = value.shape().to_vec();
        self.nodes.push(Node { op, shape, value, magnitude: m });
        Some(self.nodes.len() - 1)
    }

    fn value(&self, i: usize) -> &ArrayD<f64> {
        &self.nodes[i].value
    }

    fn shape(&self, i: usize) -> Vec<usize> {
        self.nodes[i].shape.clone()
    }

    /// A shape of rank 0 to 4 with axes of 1 to [`MAX_AXIS`] (half of them 1), at most
    /// [`MAX_ELEMENTS`] elements.
    fn random_shape(&mut self) -> Vec<usize> {
        let rank = self.bytes.below(5);
        let mut shape = Vec::with_capacity(rank);
        for _ in 0..rank {
            let b = self.bytes.next() as usize;
            let size = if b.is_multiple_of(2) { 1 } else { 1 + (b / 2) % MAX_AXIS };
            if numel(&shape) * size <= MAX_ELEMENTS {
                shape.push(size);
            } else {
                shape.push(1);
            }
        }
        shape
    }

    /// A new leaf of `shape` with values in [-1.5, 1.5) (`None` past [`MAX_ELEMENTS`]).
    fn leaf(&mut self, shape: &[usize]) -> Option<usize> {
        if numel(shape) > MAX_ELEMENTS {
            return None;
        }
        let values: Vec<f32> = (0..numel(shape))
            .map(|_| {
                self.seed ^= self.seed << 13;
                self.seed ^= self.seed >> 7;
                self.seed ^= self.seed << 17;
                // 24 random bits: exact in f32.
                ((self.seed >> 40) as f32 / (1u64 << 24) as f32) * 3.0 - 1.5
            })
            .collect();
        let value = ArrayD::from_shape_vec(IxDyn(shape), values.iter().map(|&v| f64::from(v)).collect())
            .expect("shape and values agree");
        self.push(Op::Leaf(values), value, 0.0)
    }

    /// The next operand: the top of the stack, or a new leaf.
    fn operand(&mut self) -> usize {
        match self.stack.pop() {
            Some(x) => x,
            None => {
                let shape = self.random_shape();
                self.leaf(&shape).expect("a random shape is within the limits")
            }
        }
    }

    /// A shape that broadcasts with `shape`: some of its axes set to 1, maybe leading ones dropped.
    fn broadcastable(&mut self, shape: &[usize]) -> Vec<usize> {
        let drop = self.bytes.below(shape.len() + 1);
        shape[drop..].iter().map(|&s| if self.bytes.below(3) == 0 { 1 } else { s }).collect()
    }

    /// A batch shape for a matmul operand whose partner has batch `batch`: broadcastable
    /// with it, or a new batch of up to `room` axes when it has none.
    fn batch_for(&mut self, batch: &[usize], room: usize) -> Vec<usize> {
        if batch.is_empty() {
            let rank = self.bytes.below(room.min(2) + 1);
            return (0..rank).map(|_| 1 + self.bytes.below(3)).collect();
        }
        self.broadcastable(batch)
    }

    /// One op on the stack: its result replaces its operand there, or, when it does not fit
    /// the operand (a reduction of a scalar, a result past the limits), the operand stays.
    fn step(&mut self) {
        let choice = self.bytes.below(16);
        let x = self.operand();
        let result = self.apply(choice, x);
        self.stack.push(result.unwrap_or(x));
    }

    /// Op `choice` applied to `x` (and operands it takes from the stack or makes).
    fn apply(&mut self, choice: usize, x: usize) -> Option<usize> {
        let sx = self.shape(x);
        let rank = sx.len();
        match choice {
            0 => {
                self.stack.push(x);
                let shape = self.random_shape();
                self.leaf(&shape).or_else(|| self.stack.pop())
            }
            1..=4 => self.binary(choice, x),
            5 => self.push(Op::Neg(x), -self.value(x), 0.0),
            6 => {
                let scale = (0.25 / max_abs(self.value(x)).max(1.0)) as f32;
                let v = self.value(x).mapv(|v| (v * f64::from(scale)).exp());
                self.push(Op::Exp(x, scale), v, 0.0)
            }
            7 | 8 if rank > 0 => {
                let (axis, keep) = (self.bytes.below(rank), self.bytes.flag());
                let v = self.value(x);
                let (r, inner) = if choice == 7 {
                    (
                        v.sum_axis(Axis(axis)),
                        v.mapv(f64::abs).sum_axis(Axis(axis)).iter().fold(0.0, |m: f64, s| m.max(*s)),
                    )
                } else {
                    (v.map_axis(Axis(axis), |l| l.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v))), 0.0)
                };
                let r = if keep { r.insert_axis(Axis(axis)) } else { r };
                let op = if choice == 7 { Op::Sum(x, axis, keep) } else { Op::Max(x, axis, keep) };
                self.push(op, r, inner)
            }
            9 if rank > 0 => {
                let axis = self.bytes.below(rank);
                let v = self.value(x);
                let m = v.map_axis(Axis(axis), |l| l.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v)));
                let e = (v - &m.insert_axis(Axis(axis))).mapv(f64::exp);
                let s = e.sum_axis(Axis(axis)).insert_axis(Axis(axis));
                self.push(Op::Softmax(x, axis), &e / &s, 0.0)
            }
            10 | 11 if rank > 0 => self.matmul(x, choice == 10),
            12 if rank > 1 => {
                // A permutation from the bytes: repeatedly pick one of the remaining axes.
                let mut left: Vec<usize> = (0..rank).collect();
                let perm: Vec<usize> = (0..rank).map(|_| left.remove(self.bytes.below(left.len()))).collect();
                let v = self.value(x).clone().permuted_axes(IxDyn(&perm));
                self.push(Op::Permute(x, perm), v.as_standard_layout().to_owned(), 0.0)
            }
            13 => {
                let shape = self.reshaped(&sx);
                let v = self.value(x).to_shape(IxDyn(&shape)).expect("same size").to_owned();
                self.push(Op::Reshape(x, shape), v, 0.0)
            }
            14 if rank > 0 => {
                let axis = self.bytes.below(rank);
                if sx[axis] == 1 {
                    // Expand an axis of 1 (a broadcast the graph itself makes).
                    let mut shape = sx.clone();
                    shape[axis] = 2 + self.bytes.below(2);
                    let v = broadcast_to(self.value(x), &shape);
                    self.push(Op::Expand(x, shape), v, 0.0)
                } else {
                    let begin = self.bytes.below(sx[axis]);
                    let end = begin + 1 + self.bytes.below(sx[axis] - begin);
                    let v = self.value(x).slice_axis(Axis(axis), Slice::from(begin..end)).to_owned();
                    self.push(Op::Slice(x, axis, begin, end), v, 0.0)
                }
            }
            15 if rank > 0 => {
                let axis = self.bytes.below(rank);
                let mut shape = sx.clone();
                shape[axis] = 1 + self.bytes.below(3);
                let y = match self.stack.last() {
                    Some(&y) if self.nodes[y].shape == shape => self.stack.pop().unwrap_or(y),
                    _ => self.leaf(&shape)?,
                };
                let v = ndarray::concatenate(Axis(axis), &[self.value(x).view(), self.value(y).view()]);
                let v = v.expect("shapes agree off the axis");
                self.push(Op::Cat(x, y, axis), v, 0.0)
            }
            _ => None,
        }
    }

    /// An elementwise op of `x` and a broadcastable operand: the next on the stack when it
    /// broadcasts with `x`, else a new leaf of a shape that does (maybe on the left).
    fn binary(&mut self, choice: usize, x: usize) -> Option<usize> {
        let sx = self.shape(x);
        let y = match self.stack.last() {
            Some(&y) if broadcast(&sx, &self.nodes[y].shape).is_some() && self.bytes.flag() => {
                self.stack.pop().unwrap_or(y)
            }
            _ => {
                let shape = self.broadcastable(&sx);
                self.leaf(&shape)?
            }
        };
        let (a, b) = if self.bytes.flag() { (y, x) } else { (x, y) };
        let shape = broadcast(&self.shape(a), &self.shape(b))?;
        let (va, vb) = (broadcast_to(self.value(a), &shape), broadcast_to(self.value(b), &shape));
        let (op, v) = match choice {
            1 => (Op::Add(a, b), &va + &vb),
            2 => (Op::Sub(a, b), &va - &vb),
            3 => (Op::Mul(a, b), &va * &vb),
            _ => (Op::Maximum(a, b), ndarray::Zip::from(&va).and(&vb).map_collect(|p, q| p.max(*q))),
        };
        self.push(op, v, 0.0)
    }

    /// `x @ y` (or `y @ x` when `!x_left`) with a new leaf `y` of a compatible shape: a vector,
    /// a matrix, or a batch that broadcasts with `x`'s.
    fn matmul(&mut self, x: usize, x_left: bool) -> Option<usize> {
        let sx = self.shape(x);
        let rank = sx.len();
        // The contracted axis of x, and x's batch.
        let k = if x_left || rank == 1 { sx[rank - 1] } else { sx[rank - 2] };
        let batch = if rank > 2 { sx[..rank - 2].to_vec() } else { Vec::new() };
        let other = 1 + self.bytes.below(MAX_AXIS);
        let sy = match self.bytes.below(3) {
            0 => vec![k],
            1 => {
                if x_left {
                    vec![k, other]
                } else {
                    vec![other, k]
                }
            }
            _ => {
                let b = self.batch_for(&batch, 4 - rank.max(2));
                let tail = if x_left { [k, other] } else { [other, k] };
                [&b[..], &tail[..]].concat()
            }
        };
        let y = match self.stack.last() {
            Some(&y) if self.nodes[y].shape == sy => self.stack.pop().unwrap_or(y),
            _ => self.leaf(&sy)?,
        };
        let (a, b) = if x_left { (x, y) } else { (y, x) };
        // Inner sizes agree by construction; batches broadcast.
        let (sa, sb) = (self.shape(a), self.shape(b));
        let (ba, bb) = (&sa[..sa.len().saturating_sub(2)], &sb[..sb.len().saturating_sub(2)]);
        let out_batch = broadcast(ba, bb)?;
        let rows = if sa.len() > 1 { sa[sa.len() - 2] } else { 1 };
        let cols = if sb.len() > 1 { sb[sb.len() - 1] } else { 1 };
        if numel(&out_batch) * rows * cols * k > MAX_PRODUCT || out_batch.len() + 2 > 4 {
            return None;
        }
        let (v, inner) = matmul_f64(self.value(a), self.value(b));
        self.push(Op::Matmul(a, b), v, inner)
    }

    /// Another shape of the same size: flattened, two neighbouring axes merged, an axis split
    /// into two factors, an axis of 1 inserted or removed.
    fn reshaped(&mut self, shape: &[usize]) -> Vec<usize> {
        let rank = shape.len();
        let mut s = shape.to_vec();
        match self.bytes.below(5) {
            0 => return if numel(shape) == 1 && self.bytes.flag() { Vec::new() } else { vec![numel(shape)] },
            1 if rank > 1 => {
                let a = self.bytes.below(rank - 1);
                let merged = s[a] * s[a + 1];
                s.splice(a..a + 2, [merged]);
            }
            2 if rank > 0 && rank < 4 => {
                let a = self.bytes.below(rank);
                let f = (2..=s[a]).find(|f| s[a].is_multiple_of(*f) && self.bytes.flag()).unwrap_or(1);
                s.splice(a..=a, [f, s[a] / f]);
            }
            3 if rank < 4 => s.insert(self.bytes.below(rank + 1), 1),
            _ => {
                if let Some(a) = s.iter().position(|&d| d == 1) {
                    s.remove(a);
                }
            }
        }
        s
    }
}

/// The graph that `bytes` decode into (any bytes do): up to 14 ops on a stack of
/// tensors, the last result the root.
pub fn decode(bytes: &[u8]) -> Graph {
    let mut bytes = Bytes(bytes);
    let seed = (0..4)
        .fold(0x9E37_79B9_7F4A_7C15u64, |s, _| (s ^ u64::from(bytes.next())).wrapping_mul(0x100_0000_01B3));
    let steps = 1 + bytes.below(MAX_STEPS);
    let mut d = Decoder { bytes, nodes: Vec::new(), stack: Vec::new(), seed: seed | 1 };
    for _ in 0..steps {
        d.step();
    }
    // The root is the last result: make it the last node.
    let root = d.stack.pop().expect("every step leaves a result");
    if root + 1 != d.nodes.len() {
        let v = -d.value(root);
        d.push(Op::Neg(root), v, 0.0).expect("negation keeps the limits");
    }
    // The magnitude of the nodes the root depends on (others are never realized).
    let mut used = vec![false; d.nodes.len()];
    used[d.nodes.len() - 1] = true;
    let mut magnitude: f64 = 0.0;
    for i in (0..d.nodes.len()).rev() {
        if used[i] {
            magnitude = magnitude.max(d.nodes[i].magnitude);
            for s in d.nodes[i].op.operands() {
                used[s] = true;
            }
        }
    }
    Graph { nodes: d.nodes, magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_like_numpy() {
        assert_eq!(broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast(&[2, 3], &[3, 3]), None);
    }

    #[test]
    fn matmul_reference_drops_vector_axes() {
        let v = ArrayD::from_shape_vec(IxDyn(&[3]), vec![1.0, 2.0, 3.0]).unwrap();
        let m = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, 0.0, -1.0, 2.0, 2.0, 2.0]).unwrap();
        let (dot, g) = matmul_f64(&v, &v);
        assert_eq!((dot.shape(), dot[IxDyn(&[])], g), (&[][..], 14.0, 14.0));
        let (mv, _) = matmul_f64(&m, &v);
        assert_eq!(mv.as_slice(), Some(&[-2.0, 12.0][..]));
        let b = ArrayD::from_shape_vec(IxDyn(&[2, 2, 1]), vec![1.0, 1.0, 0.0, 2.0]).unwrap();
        let (vb, _) = matmul_f64(&ArrayD::from_shape_vec(IxDyn(&[2]), vec![3.0, 4.0]).unwrap(), &b);
        assert_eq!((vb.shape(), vb.as_slice()), (&[2, 1][..], Some(&[7.0, 8.0][..])));
    }

    #[test]
    fn any_bytes_decode_into_a_graph_whose_shapes_agree() {
        let mut s = 1u64;
        let mut ranks = [0usize; 5];
        let mut vector_products = 0;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len % 97)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (s >> 56) as u8
                })
                .collect();
            let g = decode(&bytes);
            for n in &g.nodes {
                assert_eq!(n.shape, n.value.shape(), "{:?}", n.op);
                ranks[n.shape.len()] += 1;
                if let Op::Matmul(a, b) = n.op
                    && (g.nodes[a].shape.len() == 1 || g.nodes[b].shape.len() == 1)
                {
                    vector_products += 1;
                }
            }
            // Building the tensor checks every op's shape against the reference's.
            assert_eq!(g.tensor().shape(), &g.root().shape[..]);
        }
        assert!(ranks.iter().all(|&r| r > 0), "every rank appears: {ranks:?}");
        assert!(vector_products > 0);
    }
}
