//! Derivatives of scalar ALU expressions by the chain rule: what a kernel needs to run the
//! backward of a function the user wrote as IR (an attention score function), without a
//! tensor graph around it.

use crate::error::{IrError, IrErrorKind};
use crate::ops::{BinaryOp, Op, UnaryOp};
use crate::uop::UOp;
use crate::{DType, const_of};
use std::collections::HashMap;
use std::f64::consts::LN_2;

/// The derivative of the float expression `expr` with respect to the node `wrt` of its graph,
/// taken as an independent variable, as an expression of `expr`'s dtype over the same nodes
/// (so it reuses `expr`'s values: the derivative of `exp2(x)` reads the same `exp2(x)`).
/// `None` when it is identically zero: `expr` does not reach `wrt` through float arithmetic.
///
/// Rules (forward mode, one tangent per node): sums, differences and products by their
/// rules; `-x`, `2^x`, `log2 x`, `sqrt x` and `1 / x` by theirs; `max(a, b)` and `c ? a : b`
/// take the tangent of the operand they select; a cast between floats keeps the tangent. Integer
/// values, comparisons and casts from or to integers are piecewise constant: tangent zero.
/// Leaves (constants, loads, ranges, variables) other than `wrt` are constants.
///
/// # Errors
///
/// [`IrErrorKind::Structure`] naming a node between `wrt` and `expr` that is not a scalar
/// ALU op or a leaf (a reduction, a tile op, a store).
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{DType, buffer, derivative, idx};
///
/// let x = buffer(0, DType::F32, 1).index(idx(0)).load();
/// let f = &x * &x + x.exp2();            // x^2 + 2^x
/// let df = derivative(&f, &x)?.expect("f depends on x");
/// assert!(df.dtype() == DType::F32);
/// assert!(derivative(&idx(3).cast(DType::F32), &x)?.is_none());
/// # Ok::<(), uopc_ir::IrError>(())
/// ```
pub fn derivative(expr: &UOp, wrt: &UOp) -> Result<Option<UOp>, IrError> {
    let mut tangents: HashMap<UOp, Option<UOp>> = HashMap::new();
    // Depth first, sources before their users, never into a leaf or an integer value (their
    // tangent is zero whatever they read).
    let mut stack = vec![(expr.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if tangents.contains_key(&node) {
            continue;
        }
        if &node == wrt {
            tangents.insert(node.clone(), Some(const_of(1.0, node.dtype())));
        } else if !node.dtype().is_float() || is_leaf(&node) {
            tangents.insert(node, None);
        } else if expanded {
            let t = tangent(&node, &tangents)?;
            tangents.insert(node, t);
        } else {
            stack.push((node.clone(), true));
            stack.extend(node.src().iter().map(|s| (s.clone(), false)));
        }
    }
    Ok(tangents.remove(expr).flatten())
}

/// A node whose value the derivative takes as given.
fn is_leaf(node: &UOp) -> bool {
    matches!(node.op(), Op::Const(_) | Op::Load | Op::Range { .. } | Op::Var { .. })
}

/// The tangent of `node` from its sources' tangents.
fn tangent(node: &UOp, tangents: &HashMap<UOp, Option<UOp>>) -> Result<Option<UOp>, IrError> {
    let src = node.src();
    let of = |i: usize| tangents.get(&src[i]).cloned().flatten();
    let ln2 = |x: UOp| x * const_of(LN_2, node.dtype());
    Ok(match node.op() {
        Op::Cast => of(0).filter(|_| src[0].dtype().is_float()).map(|t| t.cast(node.dtype())),
        Op::Unary(op) => of(0).map(|t| {
            let x = &src[0];
            match op {
                UnaryOp::Neg => -t,
                UnaryOp::Exp2 => ln2(node * &t),
                UnaryOp::Log2 => t * ln2(x.clone()).recip(),
                UnaryOp::Sqrt => t * (node * const_of(2.0, node.dtype())).recip(),
                UnaryOp::Recip => -(t * node * node),
            }
        }),
        Op::Binary(op) => {
            let (a, b) = (&src[0], &src[1]);
            let (ta, tb) = (of(0), of(1));
            match op {
                BinaryOp::Add => sum(ta, tb),
                BinaryOp::Sub => sum(ta, tb.map(|t| -t)),
                BinaryOp::Mul => sum(ta.map(|t| t * b), tb.map(|t| a * &t)),
                // NaN aside, `max(a, b)` is `b < a ? a : b`.
                BinaryOp::Max => select(&b.lt(a), ta, tb, node.dtype()),
                BinaryOp::CmpLt | BinaryOp::CmpNe | BinaryOp::IDiv | BinaryOp::Mod => None,
            }
        }
        Op::Where => select(&src[0], of(1), of(2), node.dtype()),
        _ => {
            return Err(IrError::new(
                IrErrorKind::Structure,
                node,
                "has no derivative rule: only scalar ALU ops and leaves are differentiated",
            ));
        }
    })
}

/// `a + b` of two tangents, either of which may be zero.
fn sum(a: Option<UOp>, b: Option<UOp>) -> Option<UOp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// `cond ? a : b` of two tangents, either of which may be zero.
fn select(cond: &UOp, a: Option<UOp>, b: Option<UOp>, dtype: DType) -> Option<UOp> {
    if a.is_none() && b.is_none() {
        return None;
    }
    let zero = || const_of(0.0, dtype);
    Some(cond.where_(a.unwrap_or_else(zero), b.unwrap_or_else(zero)))
}
