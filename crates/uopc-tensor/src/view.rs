//! View algebra: where a chain of movement ops over a `Param` reads, evaluated at concrete
//! indices. The layout passes, the optimizers and the tile mapping ask it about strides.

use std::collections::HashSet;
use uopc_ir::{Op, UOp};

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
