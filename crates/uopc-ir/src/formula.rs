//! [`IndexFormula`]: an integer expression of constants and variables, detached from the graph,
//! so a runtime can evaluate it before a call (the trip count of a THREAD range whose end is a
//! variable, which decides how the work is split).

use crate::alu::{self, Scalar};
use crate::dtype::DType;
use crate::uop::{Op, UOp};
use std::collections::HashMap;

/// One step of an [`IndexFormula`]: an op over earlier steps, by position.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Const(Scalar),
    Var(usize),
    Unary(crate::uop::UnaryOp, usize, DType),
    Binary(crate::uop::BinaryOp, usize, usize, DType),
    Where(usize, usize, usize),
    Cast(usize, DType),
}

/// An expression built only of constants, VARs and integer or bool ALU ops, as a list of steps
/// (each node once, sources first). It holds no UOps: a compiled program keeps it without
/// keeping IR nodes alive.
///
/// # Examples
///
/// ```rust
/// use uopc_ir::{IndexFormula, idx, var};
///
/// let blocks = (var(0, 1, 4096) + 63).idiv(64) * 4;
/// let f = IndexFormula::of(&blocks).expect("constants, variables and ALU ops only");
/// assert_eq!(f.eval(&[1]), Some(4));
/// assert_eq!(f.eval(&[4096]), Some(256));
/// assert_eq!(f.eval(&[]), None, "no value for variable 0");
/// assert!(IndexFormula::of(&idx(3)).is_some());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct IndexFormula {
    steps: Vec<Step>,
}

impl IndexFormula {
    /// The formula of integer expression `expr`; `None` when it mentions anything but
    /// constants, VARs and integer or bool ALU ops (a RANGE, a LOAD), or is not an integer.
    #[must_use]
    pub fn of(expr: &UOp) -> Option<IndexFormula> {
        IndexFormula::build(expr, &[])
    }

    /// The formula of `expr` with the RANGE nodes of `ranges` read as variables `0..`
    /// (`ranges[k]` is variable `k`), so a range's iterations can be enumerated; `None` when it
    /// mentions anything else that varies (another RANGE, a VAR, a LOAD).
    #[must_use]
    pub fn over_ranges(expr: &UOp, ranges: &[UOp]) -> Option<IndexFormula> {
        IndexFormula::build(expr, ranges)
    }

    fn build(expr: &UOp, ranges: &[UOp]) -> Option<IndexFormula> {
        if !expr.dtype().is_int() {
            return None;
        }
        let mut at: HashMap<UOp, usize> = HashMap::new();
        let mut steps = Vec::new();
        for u in UOp::toposort(std::slice::from_ref(expr)) {
            if u.dtype().is_float() {
                return None;
            }
            let s = |k: usize| u.src().get(k).and_then(|x| at.get(x).copied());
            let step = match u.op() {
                _ if !ranges.is_empty() && matches!(u.op(), Op::Range { .. } | Op::Var { .. }) => {
                    Step::Var(ranges.iter().position(|r| *r == u)?)
                }
                Op::Const(c) => Step::Const(Scalar::of_const(*c, u.dtype())),
                Op::Var { slot, .. } => Step::Var(slot.index()),
                Op::Unary(op) => Step::Unary(*op, s(0)?, u.dtype()),
                Op::Binary(op) => Step::Binary(*op, s(0)?, s(1)?, u.dtype()),
                Op::Where => Step::Where(s(0)?, s(1)?, s(2)?),
                Op::Cast => Step::Cast(s(0)?, u.dtype()),
                _ => return None,
            };
            at.insert(u.clone(), steps.len());
            steps.push(step);
        }
        Some(IndexFormula { steps })
    }

    /// The value with `vars[k]` for variable slot `k`, with the IR's integer semantics
    /// (wrapping arithmetic, `x / 0 == 0`); `None` when a variable has no value.
    #[must_use]
    pub fn eval(&self, vars: &[i64]) -> Option<i64> {
        let mut vals: Vec<Scalar> = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let v = match *step {
                Step::Const(c) => c,
                Step::Var(slot) => Scalar::Int(*vars.get(slot)?),
                Step::Unary(op, a, d) => alu::unary(op, vals[a], d)?,
                Step::Binary(op, a, b, d) => alu::binary(op, vals[a], vals[b], d)?,
                Step::Where(c, a, b) => match vals[c] {
                    Scalar::Bool(true) => vals[a],
                    Scalar::Bool(false) => vals[b],
                    _ => return None,
                },
                Step::Cast(a, d) => alu::cast(vals[a], d),
            };
            vals.push(v);
        }
        match vals.last()? {
            Scalar::Int(i) => Some(*i),
            _ => None,
        }
    }
}
