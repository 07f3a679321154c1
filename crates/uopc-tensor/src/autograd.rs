//! Reverse-mode automatic differentiation on the lazy tensor graph.
//!
//! [`gradient`] walks the tensor-level UOp graph under a loss once, in reverse topological
//! order (an explicit toposort: graphs are deep), and gives every node on a path from a
//! parameter to the loss the sum of its consumers' contributions. The gradients are ordinary
//! lazy [`Tensor`]s built from the same ops as the forward graph, so they are kernelized,
//! fused and JIT-compiled like anything else; nothing runs until they are realized.
//!
//! Rules worth knowing:
//! - `detach` (a DETACH node) stops gradients; comparisons, integer ops and casts to
//!   non-float dtypes have no gradient.
//! - Both `maximum` and the `max` reduction split the gradient evenly between tied inputs
//!   (half to each side of a tied `maximum`, `1/k` to each of `k` tied maxima of a row).
//! - `shrink` pads its gradient with zeros using `cat` (the op set has no pad).
//! - Constants are hash-consed, so a scalar constant is one node wherever it appears: asking
//!   for the gradient of a constant gives the sum over all its uses.

use crate::error::{Result, TensorError};
use crate::tensor::Tensor;
use std::collections::{HashMap, HashSet};
use uopc_ir::{BinaryOp, DType, Op, ReduceOp, UOp, UnaryOp, const_of};

/// Whether gradients flow through values of `d`: floats, 16-bit ones included (16-bit tensors
/// compute in f32 between casts, so their gradients flow through those casts, and a 16-bit
/// parameter gets a 16-bit gradient).
fn differentiable(d: DType) -> bool {
    d.is_float() || d.is_half()
}

/// Gradients of `loss` with respect to each of `params`, as lazy tensors of the parameters'
/// shapes and dtypes.
///
/// `loss` must have one element (as torch's implicit gradient requires): the gradient of
/// anything else depends on a cotangent, which [`vjp`] takes. A parameter the loss does not
/// depend on (or only through `detach`) gets zeros.
///
/// ```rust
/// use uopc_tensor::{Tensor, gradient};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
/// let loss = (&x * &x).sum(0, false);
/// let g = gradient(&loss, &[&x])?;
/// assert_eq!(g[0].to_ndarray::<f32>()?.as_slice(), Some(&[2.0, 4.0, 6.0][..]));
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Errors
///
/// [`TensorError::DType`] naming `gradient` when `loss` or a parameter is not a float tensor
/// (f32, f64, bf16 or f16), [`TensorError::Shape`] naming `gradient` and `loss`'s shape when
/// it has more (or fewer) than one element.
pub fn gradient(loss: &Tensor, params: &[&Tensor]) -> Result<Vec<Tensor>> {
    if loss.numel() != 1 {
        return Err(TensorError::Shape {
            op: "gradient",
            msg: format!(
                "output has shape {:?}; an implicit gradient needs one element (vjp takes a cotangent)",
                loss.shape()
            ),
        });
    }
    let seed = filled(loss, 1.0);
    vjp(loss, params, &seed)
}

/// Vector-Jacobian product: the gradients of `sum(output * cotangent)` with respect to each
/// of `params` (`cotangent` must have `output`'s shape; it is cast to `output`'s dtype and
/// treated as a constant).
///
/// # Errors
///
/// [`TensorError::DType`] naming `gradient` when `output` or a parameter is not a float tensor,
/// [`TensorError::Shape`] when `cotangent`'s shape is not `output`'s.
pub fn vjp(output: &Tensor, params: &[&Tensor], cotangent: &Tensor) -> Result<Vec<Tensor>> {
    if !differentiable(output.dtype()) {
        return Err(TensorError::DType { op: "gradient", msg: format!("output is {}", output.dtype()) });
    }
    if let Some(p) = params.iter().find(|p| !differentiable(p.dtype())) {
        return Err(TensorError::DType {
            op: "gradient",
            msg: format!("parameter {p:?} is not a float tensor"),
        });
    }
    if cotangent.shape() != output.shape() {
        return Err(TensorError::Shape {
            op: "gradient",
            msg: format!("cotangent {:?} does not match output {:?}", cotangent.shape(), output.shape()),
        });
    }
    let targets: HashSet<UOp> = params.iter().map(|p| p.uop().clone()).collect();
    let topo = UOp::toposort(std::slice::from_ref(output.uop()));
    // Nodes through which some parameter reaches the output: only these get gradients.
    let mut live: HashSet<UOp> = HashSet::new();
    for u in &topo {
        let flows = differentiable(u.dtype())
            && !matches!(u.op(), Op::Detach)
            && u.src().iter().any(|s| live.contains(s));
        if targets.contains(u) || flows {
            live.insert(u.clone());
        }
    }
    let mut grads: HashMap<UOp, Tensor> = HashMap::new();
    if live.contains(output.uop()) {
        grads.insert(output.uop().clone(), cotangent.cast(output.dtype()).detach());
    }
    for u in topo.iter().rev() {
        if !live.contains(u) {
            continue;
        }
        // Parameters keep their accumulated gradient; interior ones also pass it on.
        let Some(g) = grads.get(u).cloned() else { continue };
        for (k, contrib) in backward_rule(u, &g, &live)? {
            // By position: the rule names each contribution's source by its index.
            let s = &u.src()[k];
            if !live.contains(s) {
                continue;
            }
            let contrib = unbroadcast(contrib, s)?;
            let total = match grads.remove(s) {
                Some(prev) => prev.try_add(&contrib)?,
                None => contrib,
            };
            grads.insert(s.clone(), total);
        }
    }
    Ok(params.iter().map(|p| grads.get(p.uop()).cloned().unwrap_or_else(|| filled(p, 0.0))).collect())
}

impl Tensor {
    /// Gradients of this one-element tensor with respect to `params`; see [`gradient`].
    ///
    /// # Errors
    ///
    /// As [`gradient`](crate::gradient).
    pub fn gradient(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        gradient(self, params)
    }
}

fn t(u: UOp) -> Tensor {
    Tensor::from_uop(u)
}

/// A tensor of `like`'s shape and dtype filled with `v` (a broadcast constant).
fn filled(like: &Tensor, v: f64) -> Tensor {
    let c = t(const_of(v, like.dtype()));
    if like.shape().is_empty() {
        return c;
    }
    c.reshape(&vec![1; like.ndim()]).expand(like.shape())
}

/// A zero tensor of `shape` with `like`'s dtype.
fn zeros(shape: &[usize], like: &Tensor) -> Tensor {
    let c = t(const_of(0.0, like.dtype()));
    c.reshape(&vec![1; shape.len()]).expand(shape)
}

/// `x * v` with `v` as an exact constant of `x`'s dtype (the `f32` scalar operators would
/// round constants like `ln 2` for f64 tensors).
fn scale(x: &Tensor, v: f64) -> Tensor {
    let c = const_of(v, x.dtype());
    t(UOp::new(Op::Binary(BinaryOp::Mul), x.dtype(), vec![x.uop().clone(), c]))
}

/// A scalar constant of `x`'s dtype.
fn scalar_like(x: &Tensor, v: f64) -> Tensor {
    t(const_of(v, x.dtype()))
}

/// A contribution for source `s`, summed down to `s`'s shape when `s` is a scalar constant
/// that an ALU op broadcast implicitly.
fn unbroadcast(c: Tensor, s: &UOp) -> Result<Tensor> {
    if c.shape() == s.shape() {
        return Ok(c);
    }
    if s.shape().is_empty() {
        return c.try_reshape(&[c.numel()])?.try_sum(0, false);
    }
    Err(TensorError::Unsupported(format!("gradient of {:?} has shape {:?}", s.short(), c.shape())))
}

/// Sums `x` over its trailing `axes` axes, keeping them as size 1.
fn sum_trailing_keep(x: &Tensor, axes: usize) -> Result<Tensor> {
    let shape = x.shape();
    let lead = &shape[..shape.len() - axes];
    let mut flat = lead.to_vec();
    flat.push(shape[shape.len() - axes..].iter().product());
    let s = x.try_reshape(&flat)?.try_sum(-1, false)?;
    let mut keep = lead.to_vec();
    keep.extend(std::iter::repeat_n(1, axes));
    s.try_reshape(&keep)
}

/// The gradient `g` of a SHRINK to `bounds` of a tensor of shape `full`, padded back to `full`
/// with zeros, one axis at a time.
fn padded_back(g: &Tensor, bounds: &[(usize, usize)], full: &[usize]) -> Result<Tensor> {
    let mut gx = g.clone();
    for (a, (&(lo, hi), &n)) in bounds.iter().zip(full).enumerate() {
        if lo == 0 && hi == n {
            continue;
        }
        let mut parts = Vec::new();
        let mut side = gx.shape().to_vec();
        if lo > 0 {
            side[a] = lo;
            parts.push(zeros(&side, g));
        }
        parts.push(gx.clone());
        if hi < n {
            side[a] = n - hi;
            parts.push(zeros(&side, g));
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        gx = Tensor::try_cat(&refs, a as isize)?;
    }
    Ok(gx)
}

/// The contribution of `g` (the gradient of node `u`) to each differentiable source, by
/// source position; `live` holds the nodes some parameter reaches the output through (a
/// custom kernel's rule is told which of its sources those are).
fn backward_rule(u: &UOp, g: &Tensor, live: &HashSet<UOp>) -> Result<Vec<(usize, Tensor)>> {
    // Source `k` as a tensor: the rules below answer by source position, so they read their
    // operands by the same positions.
    let src = |k: usize| t(u.src()[k].clone());
    let out = t(u.clone());
    Ok(match u.op() {
        Op::Stage => vec![(0, g.clone())],
        // The value's own ops are not differentiated: the rule gives the cotangent of `wrt`.
        Op::GradientRule(data) => {
            let Some(rule) = crate::tensor::gradient_rule(data) else {
                return Err(TensorError::Unsupported("gradient: a GRADIENT_RULE node holds no rule".into()));
            };
            vec![(1, rule(&src(1), g)?)]
        }
        Op::Cast => {
            let x = src(0);
            if differentiable(x.dtype()) { vec![(0, g.cast(x.dtype()))] } else { vec![] }
        }
        Op::Unary(op) => {
            let x = src(0);
            let gx = match op {
                UnaryOp::Neg => g.neg(),
                // d 2^x = 2^x ln 2
                UnaryOp::Exp2 => scale(&(g * &out), std::f64::consts::LN_2),
                // d log2 x = 1 / (x ln 2)
                UnaryOp::Log2 => scale(&(g * x.recip()), std::f64::consts::LOG2_E),
                UnaryOp::Sqrt => scale(&(g * out.recip()), 0.5),
                UnaryOp::Recip => (g * &out * &out).neg(),
            };
            vec![(0, gx)]
        }
        Op::Binary(op) => {
            let (a, b) = (src(0), src(1));
            match op {
                BinaryOp::Add => vec![(0, g.clone()), (1, g.clone())],
                BinaryOp::Sub => vec![(0, g.clone()), (1, g.neg())],
                BinaryOp::Mul => vec![(0, g * &b), (1, g * &a)],
                BinaryOp::Max => {
                    // weight of `a`: 1 where it wins, 1/2 on a tie, 0 where `b` wins
                    let (one, half, zero) = (scalar_like(g, 1.0), scalar_like(g, 0.5), scalar_like(g, 0.0));
                    let tie = a.try_eq(&b)?.try_where(&half, &zero)?;
                    let wa = a.try_gt(&b)?.try_where(&one, &tie)?;
                    let wb = one.try_sub(&wa)?;
                    vec![(0, g * &wa), (1, g * &wb)]
                }
                BinaryOp::CmpLt | BinaryOp::CmpNe | BinaryOp::IDiv | BinaryOp::Mod => vec![],
            }
        }
        Op::Where => {
            let (c, zero) = (src(0), scalar_like(g, 0.0));
            vec![(1, c.try_where(g, &zero)?), (2, c.try_where(&zero, g)?)]
        }
        Op::Reshape(_) => vec![(0, g.try_reshape(src(0).shape())?)],
        Op::Expand(shape) => {
            let x = src(0);
            let s = x.shape();
            let mut gx = g.clone();
            for (k, (&from, &to)) in s.iter().zip(shape).enumerate() {
                if from == 1 && to != 1 {
                    gx = gx.try_sum(k as isize, true)?;
                }
            }
            vec![(0, gx)]
        }
        Op::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                inv[p] = k;
            }
            vec![(0, g.try_permute(&inv)?)]
        }
        Op::Shrink(bounds) => vec![(0, padded_back(g, bounds, src(0).shape())?)],
        Op::Reduce { op, axes } => {
            let x = src(0);
            let xs = x.shape().to_vec();
            let mut kept = out.shape().to_vec();
            kept.extend(std::iter::repeat_n(1, *axes));
            let g_full = g.try_reshape(&kept)?.try_expand(&xs)?;
            match op {
                ReduceOp::Add => vec![(0, g_full)],
                ReduceOp::Max => {
                    // the gradient goes to the maxima of each reduced group, split evenly on ties
                    let m = out.try_reshape(&kept)?.try_expand(&xs)?;
                    let hit = x.try_eq(&m)?.cast(x.dtype());
                    let count = sum_trailing_keep(&hit, *axes)?.try_expand(&xs)?;
                    vec![(0, g_full.try_mul(&hit)?.try_mul(&count.recip())?)]
                }
            }
        }
        Op::Stack => {
            let s = src(0).shape().to_vec();
            (0..u.src().len())
                .map(|k| Ok((k, g.try_slice(0, k, k + 1)?.try_reshape(&s)?)))
                .collect::<Result<_>>()?
        }
        Op::Custom(custom) => {
            if let Some(rule) = crate::tensor::custom_vjp(custom) {
                let sources: Vec<Tensor> = u.src().iter().map(|s| t(s.clone())).collect();
                let grads = match rule {
                    crate::tensor::AttachedVjp::Plain(rule) => rule(&sources, &out, g)?,
                    crate::tensor::AttachedVjp::Wanted(rule) => {
                        let wanted: Vec<bool> = u.src().iter().map(|s| live.contains(s)).collect();
                        rule(&sources, &wanted, &out, g)?
                    }
                };
                if grads.len() != sources.len() {
                    return Err(TensorError::Unsupported(format!(
                        "gradient: the rule of custom kernel {} gave {} cotangents for {} sources",
                        custom.name,
                        grads.len(),
                        sources.len()
                    )));
                }
                return Ok(grads.into_iter().enumerate().filter_map(|(k, x)| x.map(|x| (k, x))).collect());
            }
            // Otherwise the kernel's gradient is that of its equivalent graph over the same sources.
            let Some(equivalent) = &custom.equivalent else {
                return Err(TensorError::Unsupported(format!(
                    "gradient: custom kernel {} has no equivalent graph to differentiate",
                    custom.name
                )));
            };
            let sources: Vec<Tensor> = u.src().iter().map(|s| t(s.clone())).collect();
            let refs: Vec<&Tensor> = sources.iter().collect();
            vjp(&t(equivalent.clone()), &refs, g)?.into_iter().enumerate().collect()
        }
        // leaves, DETACH, and loop-IR nodes (never in a tensor graph)
        _ => vec![],
    })
}
