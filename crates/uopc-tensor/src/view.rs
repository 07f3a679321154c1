//! View algebra: where a chain of movement ops over a `Param` reads, evaluated at concrete
//! indices (the layout passes, the optimizers and the tile mapping ask it about strides) or at
//! symbolic ones (the index a movement op reads its source at, as rangeify lowers it).

use std::collections::HashSet;
use uopc_ir::{Op, UOp, idx};

/// Flat offset in the base `Param` that movement view `v` reads at a concrete index, or `None`
/// when `v` is not a chain of movement ops over a `Param`.
pub(crate) fn view_offset(v: &UOp, index: Vec<usize>) -> Option<usize> {
    let (mut v, mut index) = (v.clone(), index);
    loop {
        let src = v.src().first().cloned();
        match v.op() {
            Op::Param { shape, .. } => {
                return Some(index.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i));
            }
            Op::Reshape(shape) => {
                let flat = index.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i);
                let src_shape = src.as_ref()?.shape();
                let mut rest = flat;
                let mut new = vec![0; src_shape.len()];
                for k in (0..src_shape.len()).rev() {
                    new[k] = rest % src_shape[k];
                    rest /= src_shape[k];
                }
                index = new;
            }
            Op::Expand(_) => {
                let ss = src.as_ref()?.shape();
                index = index.iter().zip(ss).map(|(&i, &s)| if s == 1 { 0 } else { i }).collect();
            }
            Op::Permute(perm) => {
                let mut inv = vec![0; index.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inv[p] = index[k];
                }
                index = inv;
            }
            Op::Shrink(b) => index = index.iter().zip(b).map(|(&i, &(lo, _))| i + lo).collect(),
            _ => return None,
        }
        v = src?;
    }
}

/// The movement ops from `v` down to the first node that is not one, top first, and that node.
pub(crate) fn movement_chain(v: &UOp) -> (Vec<UOp>, UOp) {
    let mut chain = Vec::new();
    let mut base = v.clone();
    while let Some(viewed) = base.as_movement().cloned() {
        chain.push(std::mem::replace(&mut base, viewed));
    }
    (chain, base)
}

/// The movement ops of `chain` (top first, as [`movement_chain`] lists them) applied again over
/// `base`, which must have the shape the lowest of them read.
pub(crate) fn reapply(chain: &[UOp], base: UOp) -> UOp {
    chain.iter().rev().fold(base, |w, m| UOp::new(m.op().clone(), w.dtype(), vec![w]))
}

/// The views a reduce input `x` reads whose stride along `axis` is neither 0 (broadcast) nor
/// 1 (contiguous), each as the un-broadcast view below its outermost EXPAND: without a
/// broadcast every element is read once, and a copy would only add a pass.
pub(crate) fn strided_broadcast_views(x: &UOp, axis: usize) -> Vec<UOp> {
    let xs = x.shape().to_vec();
    let mut found = Vec::new();
    let mut stack = vec![x.clone()];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v.clone()) {
            continue;
        }
        if v.op().is_alu() {
            stack.extend(v.src().iter().cloned());
            continue;
        }
        if !v.op().is_movement() || v.shape() != xs.as_slice() {
            continue;
        }
        let mut p0 = vec![0; xs.len()];
        let a = view_offset(&v, p0.clone());
        p0[axis] = 1;
        let (Some(a), Some(b)) = (a, view_offset(&v, p0)) else { continue };
        if b == a || b == a + 1 {
            continue;
        }
        let mut w = v.clone();
        while let Some(viewed) = w.as_movement().cloned() {
            if matches!(w.op(), Op::Expand(_)) {
                if viewed.op().is_movement() && viewed.shape().len() == xs.len() {
                    found.push(viewed);
                }
                break;
            }
            w = viewed;
        }
    }
    found
}

/// Row-major flat offset of `index` in `shape` (size-1 axes contribute nothing).
pub(crate) fn ravel(index: &[UOp], shape: &[usize]) -> UOp {
    let mut flat: Option<UOp> = None;
    let mut stride = 1usize;
    for (i, &s) in index.iter().zip(shape).rev() {
        if s != 1 {
            let term = if stride == 1 { i.clone() } else { i * stride };
            flat = Some(match flat {
                None => term,
                Some(f) => term + f,
            });
        }
        stride *= s;
    }
    flat.unwrap_or_else(|| idx(0))
}

/// The per-axis index in `shape` of a flat offset: `(flat // stride) % size`.
pub(crate) fn unravel(flat: &UOp, shape: &[usize]) -> Vec<UOp> {
    let mut out = vec![idx(0); shape.len()];
    let mut stride = 1usize;
    for k in (0..shape.len()).rev() {
        if shape[k] != 1 {
            out[k] = flat.idiv(stride as i64).modulo(shape[k] as i64);
        }
        stride *= shape[k];
    }
    out
}

/// The index into the source of movement op `u` that `u` reads at `index` (a RESHAPE's is
/// left unsimplified; any other op reads its source at `index`).
pub(crate) fn movement_source_index(u: &UOp, index: &[UOp]) -> Vec<UOp> {
    let Some(src) = u.src().first() else { return index.to_vec() };
    match u.op() {
        Op::Reshape(shape) => unravel(&ravel(index, shape), src.shape()),
        Op::Expand(shape) => index
            .iter()
            .zip(src.shape().iter().zip(shape))
            .map(|(i, (&s, &n))| if s == 1 && n != 1 { idx(0) } else { i.clone() })
            .collect(),
        Op::Permute(perm) => {
            let mut inv = vec![idx(0); index.len()];
            for (k, &p) in perm.iter().enumerate() {
                inv[p] = index[k].clone();
            }
            inv
        }
        Op::Shrink(bounds) => {
            index.iter().zip(bounds).map(|(i, &(b, _))| if b == 0 { i.clone() } else { i + b }).collect()
        }
        _ => index.to_vec(),
    }
}
