//! Linear forms `sum(coeff * atom) + constant` of integer expressions: how simplify
//! canonicalizes sums and splits them for division and modulo.

use crate::dtype::DType;
use crate::uop::{BinaryOp, ConstValue, Op, UOp, UnaryOp};

use super::bounds::clamp128;
use super::well_formed;

/// A linear form `sum(coeff * atom) + constant` of an integer expression. Terms are sorted by
/// atom creation order with no zero coefficient once normalized, so equal forms build equal
/// nodes.
#[derive(Clone, Debug, Default)]
pub(super) struct LinearForm {
    /// `(atom, coefficient)` pairs.
    pub(super) terms: Vec<(UOp, i64)>,
    /// The constant summand.
    pub(super) constant: i64,
}

impl LinearForm {
    /// The normalized linear form of `u`; `None` if a coefficient or the constant overflows i64.
    pub(super) fn of(u: &UOp) -> Option<LinearForm> {
        let mut lin = LinearForm::default();
        lin.add(u, 1)?;
        lin.normalize();
        Some(lin)
    }

    /// Adds `coeff * u`, flattening sums with an explicit stack (chains can be very deep).
    pub(super) fn add(&mut self, u: &UOp, coeff: i64) -> Option<()> {
        let mut stack = vec![(u.clone(), coeff)];
        while let Some((u, coeff)) = stack.pop() {
            let src = u.src();
            let k = |i: usize| src.get(i).and_then(|s| s.const_int());
            if !well_formed(&u) {
                self.terms.push((u.clone(), coeff));
                continue;
            }
            match u.op() {
                Op::Const(c) => self.constant = self.constant.checked_add(c.as_i64().checked_mul(coeff)?)?,
                Op::Binary(BinaryOp::Add) => {
                    stack.push((src[1].clone(), coeff));
                    stack.push((src[0].clone(), coeff));
                }
                Op::Binary(BinaryOp::Sub) => {
                    stack.push((src[1].clone(), coeff.checked_neg()?));
                    stack.push((src[0].clone(), coeff));
                }
                Op::Unary(UnaryOp::Neg) => stack.push((src[0].clone(), coeff.checked_neg()?)),
                Op::Binary(BinaryOp::Mul) if k(1).is_some() => {
                    stack.push((src[0].clone(), coeff.checked_mul(k(1)?)?))
                }
                Op::Binary(BinaryOp::Mul) if k(0).is_some() => {
                    stack.push((src[1].clone(), coeff.checked_mul(k(0)?)?))
                }
                _ => self.terms.push((u.clone(), coeff)),
            }
        }
        Some(())
    }

    /// Sorts the terms, merges equal atoms and drops zero coefficients.
    pub(super) fn normalize(&mut self) {
        self.terms.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(UOp, i64)> = Vec::with_capacity(self.terms.len());
        for (u, c) in self.terms.drain(..) {
            match out.last_mut() {
                Some((v, k)) if *v == u => *k = k.wrapping_add(c),
                _ => out.push((u, c)),
            }
        }
        out.retain(|(_, c)| *c != 0);
        self.terms = out;
    }

    /// The form split by a divisor `c > 0` as `c * quotient + remainder`: the terms whose
    /// coefficients `c` divides, divided by it, with the constant's Euclidean quotient; and the
    /// other terms with the constant's remainder.
    pub(super) fn split_by(&self, c: i64) -> (LinearForm, LinearForm) {
        let (mut quot, mut rem) = (LinearForm::default(), LinearForm::default());
        for (t, k) in &self.terms {
            if k % c == 0 {
                quot.terms.push((t.clone(), k / c));
            } else {
                rem.terms.push((t.clone(), *k));
            }
        }
        quot.constant = self.constant.div_euclid(c);
        rem.constant = self.constant.rem_euclid(c);
        (quot, rem)
    }

    /// Bounds of the form's value from its atoms' bounds (computed in i128, then saturated).
    pub(super) fn bounds(&self) -> (i64, i64) {
        let mut lo = self.constant as i128;
        let mut hi = self.constant as i128;
        for (u, c) in &self.terms {
            let (a, b) = u.bounds();
            let (x, y) = (a as i128 * *c as i128, b as i128 * *c as i128);
            lo += x.min(y);
            hi += x.max(y);
        }
        (clamp128(lo), clamp128(hi))
    }

    /// The expression `t0*c0 + t1*c1 + ... + constant` (unit coefficients and a zero constant
    /// left out), built left to right.
    pub(super) fn build(&self, dtype: DType) -> UOp {
        let mut acc: Option<UOp> = None;
        for (u, c) in &self.terms {
            let term = if *c == 1 { u.clone() } else { u.binary(BinaryOp::Mul, konst(*c, dtype)) };
            acc = Some(match acc {
                None => term,
                Some(a) => a.binary(BinaryOp::Add, term),
            });
        }
        match acc {
            None => konst(self.constant, dtype),
            Some(a) if self.constant == 0 => a,
            Some(a) => a.binary(BinaryOp::Add, konst(self.constant, dtype)),
        }
    }
}

/// An integer constant of `dtype`, wrapped to its width (sums and products are computed in i64
/// and wrap like the machine's arithmetic).
pub(super) fn konst(v: i64, dtype: DType) -> UOp {
    UOp::new(Op::Const(ConstValue::Int(v).cast(dtype)), dtype, vec![])
}

/// Whether `u` is ADD, SUB, NEG, or MUL by an integer constant: the ops a linear form absorbs.
pub(super) fn is_linear_op(u: &UOp) -> bool {
    match u.as_binary() {
        Some((BinaryOp::Add | BinaryOp::Sub, ..)) => true,
        Some((BinaryOp::Mul, a, b)) => a.const_int().is_some() || b.const_int().is_some(),
        _ => matches!(u.op(), Op::Unary(UnaryOp::Neg)),
    }
}
