//! Value bounds of integer and bool expressions: `vmin`/`vmax`, from the ranges and constants
//! an expression is built of, cached on each node.

use crate::dtype::DType;
use crate::uop::{BinaryOp, Op, UOp, UnaryOp};

use super::well_formed;

/// The full range of `dtype`'s values: what is known of an expression nothing better is known of.
fn dtype_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::Bool => (0, 1),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

/// An interval computed in i128; if it leaves `full` the i64/i32 arithmetic may wrap.
fn wide(lo: i128, hi: i128, full: (i64, i64)) -> (i64, i64) {
    if lo < full.0 as i128 || hi > full.1 as i128 { full } else { (lo as i64, hi as i64) }
}

/// `v` saturated to the i64 range.
pub(super) fn clamp128(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

impl UOp {
    /// Lower bound of an integer or bool expression (the dtype's minimum when unknown).
    pub fn vmin(&self) -> i64 {
        self.bounds().0
    }

    /// Upper bound of an integer or bool expression (the dtype's maximum when unknown).
    pub fn vmax(&self) -> i64 {
        self.bounds().1
    }

    /// `(vmin, vmax)`, cached on the node and computed without recursion.
    pub fn bounds(&self) -> (i64, i64) {
        if let Some(b) = self.node_bounds() {
            return b;
        }
        let mut stack = vec![(self.clone(), false)];
        while let Some((u, ready)) = stack.pop() {
            if u.node_bounds().is_some() {
                continue;
            }
            if ready {
                let b = compute_bounds(&u);
                u.set_node_bounds(b);
            } else {
                stack.push((u.clone(), true));
                for s in u.src() {
                    if s.node_bounds().is_none() {
                        stack.push((s.clone(), false));
                    }
                }
            }
        }
        self.node_bounds().expect("bounds computed above")
    }
}

fn compute_bounds(u: &UOp) -> (i64, i64) {
    let d = u.dtype();
    if d.is_float() {
        return (i64::MIN, i64::MAX);
    }
    if !well_formed(u) {
        return dtype_bounds(d);
    }
    // Source `k`'s bounds, by position: the arms below are written over the operand order of
    // each op, which `well_formed` has checked.
    let s = |k: usize| u.src()[k].node_bounds().unwrap_or(dtype_bounds(u.src()[k].dtype()));
    let full = dtype_bounds(d);
    let b = match u.op() {
        Op::Const(c) => {
            let v = c.as_i64();
            (v, v)
        }
        Op::Var { lo, hi, .. } => (*lo, *hi),
        Op::Range { .. } => (0, s(0).1.saturating_sub(1).max(0)),
        Op::Unary(UnaryOp::Neg) => wide(-(s(0).1 as i128), -(s(0).0 as i128), full),
        Op::Binary(op) => {
            let (a, b) = (s(0), s(1));
            match op {
                BinaryOp::Add => wide(a.0 as i128 + b.0 as i128, a.1 as i128 + b.1 as i128, full),
                BinaryOp::Sub => wide(a.0 as i128 - b.1 as i128, a.1 as i128 - b.0 as i128, full),
                BinaryOp::Mul => {
                    let c = [
                        a.0 as i128 * b.0 as i128,
                        a.0 as i128 * b.1 as i128,
                        a.1 as i128 * b.0 as i128,
                        a.1 as i128 * b.1 as i128,
                    ];
                    wide(*c.iter().min().unwrap(), *c.iter().max().unwrap(), full)
                }
                BinaryOp::IDiv if b.0 > 0 => {
                    let c = [a.0 / b.0, a.0 / b.1, a.1 / b.0, a.1 / b.1];
                    (*c.iter().min().unwrap(), *c.iter().max().unwrap())
                }
                BinaryOp::Mod if b.0 > 0 => {
                    let m = b.1 - 1;
                    if a.0 >= 0 { (0, m.min(a.1)) } else { (-m, m) }
                }
                BinaryOp::Max => (a.0.max(b.0), a.1.max(b.1)),
                BinaryOp::CmpLt => {
                    if a.1 < b.0 {
                        (1, 1)
                    } else if a.0 >= b.1 {
                        (0, 0)
                    } else {
                        (0, 1)
                    }
                }
                BinaryOp::CmpNe => {
                    if a.1 < b.0 || b.1 < a.0 {
                        (1, 1)
                    } else if a.0 == a.1 && b.0 == b.1 && a.0 == b.0 {
                        (0, 0)
                    } else {
                        (0, 1)
                    }
                }
                _ => full,
            }
        }
        Op::Where => {
            let (c, a, b) = (s(0), s(1), s(2));
            if c == (1, 1) {
                a
            } else if c == (0, 0) {
                b
            } else {
                (a.0.min(b.0), a.1.max(b.1))
            }
        }
        Op::Cast if u.as_cast().is_some_and(|x| !x.dtype().is_float()) => {
            let a = s(0);
            if a.0 >= full.0 && a.1 <= full.1 { a } else { full }
        }
        _ => full,
    };
    // Bounds that leave the dtype's range mean the arithmetic may wrap: nothing is known.
    if b.0 < full.0 || b.1 > full.1 || b.0 > b.1 { full } else { b }
}

impl UOp {
    fn node_bounds(&self) -> Option<(i64, i64)> {
        self.node().bounds.get().copied()
    }
    fn set_node_bounds(&self, b: (i64, i64)) {
        let _ = self.node().bounds.set(b);
    }
}
