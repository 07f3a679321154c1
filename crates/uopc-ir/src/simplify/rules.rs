//! simplify's rules, as named tables run in this order: constant folding, algebraic identities,
//! selections, linear-sum canonicalization, and division/modulo folding with bounds. Within a
//! node the first rule that applies wins, so the order decides the canonical form.
//!
//! Every rule sees a node whose sources are simplified already, and every table's guard admits
//! only nodes with the arity their op needs (malformed input is left to the verifier).

use super::linear::{LinearForm, is_linear_op, konst};
use super::well_formed;
use crate::alu::{self, Scalar};
use crate::dtype::DType;
use crate::rewrite::{Pattern, Rule, RuleTable};
use crate::uop::{BinaryOp, ConstValue, Op, UOp, UnaryOp};

/// Whether `u` and its sources have the arities their ops need.
fn admitted(u: &UOp) -> bool {
    well_formed(u) && u.src().iter().all(well_formed)
}

fn unary_ops() -> Pattern {
    Pattern::Ops(alu::UNARY_OPS.iter().map(|&o| crate::rewrite::OpKey::Unary(o)).collect())
}

fn binary_ops() -> Pattern {
    Pattern::Ops(alu::BINARY_OPS.iter().map(|&o| crate::rewrite::OpKey::Binary(o)).collect())
}

fn binary(op: BinaryOp) -> Pattern {
    Pattern::ops(&[Op::Binary(op)])
}

/// Evaluates ALU nodes whose sources are all constants, with the interpreter's semantics
/// ([`crate::alu`]); then folds integer and bool expressions whose bounds admit one value.
pub(super) fn constant_folding() -> RuleTable {
    RuleTable::new(
        "constant_folding",
        vec![
            Rule::new("fold_unary", unary_ops(), fold_unary),
            Rule::new("fold_binary", binary_ops(), fold_binary),
            Rule::new("fold_cast", Pattern::ops(&[Op::Cast]), fold_cast),
            Rule::new("fold_where", Pattern::ops(&[Op::Where]), fold_where),
            Rule::new("fold_value_known_from_bounds", Pattern::Alu, fold_value_known_from_bounds),
        ],
    )
    .with_guard(admitted)
}

/// Identities that hold for every value, floats included (IEEE signed zeros respected).
pub(super) fn algebraic() -> RuleTable {
    RuleTable::new(
        "algebraic",
        vec![
            Rule::new("neg_of_neg", Pattern::ops(&[Op::Unary(UnaryOp::Neg)]), neg_of_neg),
            Rule::new("float_mul_by_one", binary(BinaryOp::Mul), float_mul_by_one),
            Rule::new("float_add_negative_zero", binary(BinaryOp::Add), float_add_negative_zero),
            Rule::new("float_sub_positive_zero", binary(BinaryOp::Sub), float_sub_positive_zero),
        ],
    )
    .with_guard(admitted)
}

/// Selections decided by their operands: WHERE of equal branches, MAX of ordered bounds; and
/// a WHERE on a negated condition, which selects the other way on the condition itself.
pub(super) fn selection() -> RuleTable {
    RuleTable::new(
        "selection",
        vec![
            Rule::new("where_of_equal_branches", Pattern::ops(&[Op::Where]), where_of_equal_branches),
            Rule::new("where_of_negated_condition", Pattern::ops(&[Op::Where]), where_of_negated_condition),
            Rule::new("max_of_ordered_operands", binary(BinaryOp::Max), max_of_ordered_operands),
        ],
    )
    .with_guard(admitted)
}

/// Integer sums written in one canonical form, so equal sums become one node.
pub(super) fn linear() -> RuleTable {
    RuleTable::new(
        "linear",
        vec![
            Rule::new(
                "canonical_linear_sum",
                Pattern::ops(&[
                    Op::Binary(BinaryOp::Add),
                    Op::Binary(BinaryOp::Sub),
                    Op::Binary(BinaryOp::Mul),
                    Op::Unary(UnaryOp::Neg),
                ]),
                canonical_linear_sum,
            ),
            Rule::new("div_mod_recombine", binary(BinaryOp::Add), div_mod_recombine),
        ],
    )
    .with_guard(admitted)
}

/// Integer IDIV and MOD folded using the bounds of their operands
/// ([`super::SimplifyOptions::fold_divmod`] switches this table off).
pub(super) fn divmod() -> RuleTable {
    let idiv = || binary(BinaryOp::IDiv);
    let modulo = || binary(BinaryOp::Mod);
    RuleTable::new(
        "divmod",
        vec![
            Rule::new("idiv_by_one", idiv(), idiv_by_one),
            Rule::new("mod_by_one", modulo(), mod_by_one),
            Rule::new("idiv_of_idiv", idiv(), idiv_of_idiv),
            Rule::new("idiv_split_linear", idiv(), idiv_split_linear),
            Rule::new("idiv_common_factor", idiv(), idiv_common_factor),
            Rule::new("mod_of_small_operand", modulo(), mod_of_small_operand),
            Rule::new("mod_drop_multiples", modulo(), mod_drop_multiples),
            Rule::new("mod_common_factor", modulo(), mod_common_factor),
            Rule::new("idiv_by_larger_divisor", idiv(), idiv_by_larger_divisor),
            Rule::new("mod_by_larger_divisor", modulo(), mod_by_larger_divisor),
        ],
    )
    .with_guard(admitted)
}

// ---- constant folding ----

/// The sources' values, if all are constants (and there is at least one).
fn const_operands(u: &UOp) -> Option<Vec<Scalar>> {
    let cs: Option<Vec<Scalar>> =
        u.src().iter().map(|s| s.const_value().map(|c| Scalar::of_const(c, s.dtype()))).collect();
    cs.filter(|c| !c.is_empty())
}

fn constant(v: Scalar, dtype: DType) -> UOp {
    UOp::new(Op::Const(v.to_const(dtype)), dtype, vec![])
}

/// `op c` of a constant; EXP2 and LOG2 are not folded (the backend's approximation is their
/// semantics, and a folded value would differ from the compiled one).
fn fold_unary(u: &UOp) -> Option<UOp> {
    let Op::Unary(op) = *u.op() else { return None };
    if matches!(op, UnaryOp::Exp2 | UnaryOp::Log2) {
        return None;
    }
    let a = const_operands(u)?;
    Some(constant(alu::unary(op, a[0], u.dtype())?, u.dtype()))
}

/// `a op b` of two constants.
fn fold_binary(u: &UOp) -> Option<UOp> {
    let Op::Binary(op) = *u.op() else { return None };
    let c = const_operands(u)?;
    Some(constant(alu::binary(op, c[0], c[1], u.dtype())?, u.dtype()))
}

/// CAST of a constant.
fn fold_cast(u: &UOp) -> Option<UOp> {
    let c = const_operands(u)?;
    Some(constant(alu::cast(c[0], u.dtype()), u.dtype()))
}

/// `where(c, a, b)` of three constants: the branch `c` selects.
fn fold_where(u: &UOp) -> Option<UOp> {
    const_operands(u)?;
    let w = u.as_where()?;
    let take_first = w.cond.const_value()?.as_i64() != 0;
    Some(if take_first { w.then } else { w.otherwise }.clone())
}

/// An integer or bool ALU node whose bounds are one value is that constant.
fn fold_value_known_from_bounds(u: &UOp) -> Option<UOp> {
    let d = u.dtype();
    if !(d.is_int() || d == DType::Bool) {
        return None;
    }
    let (lo, hi) = u.bounds();
    if lo != hi {
        return None;
    }
    Some(if d == DType::Bool {
        UOp::new(Op::Const(ConstValue::Bool(lo != 0)), d, vec![])
    } else {
        konst(lo, d)
    })
}

// ---- algebraic identities ----

/// `x`'s value as an f64, if it is a constant.
fn const_f64(x: &UOp) -> Option<f64> {
    x.const_value().map(|c| c.as_f64())
}

fn is_neg_zero(v: f64) -> bool {
    v == 0.0 && v.is_sign_negative()
}

/// `-(-x) == x`.
fn neg_of_neg(u: &UOp) -> Option<UOp> {
    let (_, inner) = u.as_unary()?;
    match inner.as_unary()? {
        (UnaryOp::Neg, x) => Some(x.clone()),
        _ => None,
    }
}

/// `x * 1.0 == 1.0 * x == x` for floats.
fn float_mul_by_one(u: &UOp) -> Option<UOp> {
    let (_, a, b) = u.as_binary().filter(|_| u.dtype().is_float())?;
    if const_f64(b) == Some(1.0) {
        return Some(a.clone());
    }
    (const_f64(a) == Some(1.0)).then(|| b.clone())
}

/// `x + (-0.0) == x` for every float x; `x + 0.0` is not (`-0.0 + 0.0 == +0.0`).
fn float_add_negative_zero(u: &UOp) -> Option<UOp> {
    let (_, a, b) = u.as_binary().filter(|_| u.dtype().is_float())?;
    if const_f64(b).is_some_and(is_neg_zero) {
        return Some(a.clone());
    }
    const_f64(a).is_some_and(is_neg_zero).then(|| b.clone())
}

/// `x - (+0.0) == x` for every float x.
fn float_sub_positive_zero(u: &UOp) -> Option<UOp> {
    let (_, a, b) = u.as_binary()?;
    let positive_zero = const_f64(b).is_some_and(|v| v == 0.0 && !is_neg_zero(v));
    (u.dtype().is_float() && positive_zero).then(|| a.clone())
}

// ---- selections ----

/// `where(c, x, x) == x`.
fn where_of_equal_branches(u: &UOp) -> Option<UOp> {
    let w = u.as_where()?;
    (w.then == w.otherwise).then(|| w.then.clone())
}

/// `where(where(c, false, true), a, b)` is `where(c, b, a)`: the negation (how equality is
/// spelled, `!(x != y)`) costs its own select otherwise.
fn where_of_negated_condition(u: &UOp) -> Option<UOp> {
    let w = u.as_where()?;
    let inner = w.cond.as_where()?;
    let is = |x: &UOp, b: bool| matches!(x.const_value(), Some(crate::ConstValue::Bool(v)) if v == b);
    (is(inner.then, false) && is(inner.otherwise, true)).then(|| inner.cond.where_(w.otherwise, w.then))
}

/// Integer `max(a, b)` is `a` when `a >= b` for all values in their bounds (and `b` likewise).
fn max_of_ordered_operands(u: &UOp) -> Option<UOp> {
    if !u.dtype().is_int() {
        return None;
    }
    let (_, x, y) = u.as_binary()?;
    let (a, b) = (x.bounds(), y.bounds());
    if a.0 >= b.1 {
        return Some(x.clone());
    }
    (b.0 >= a.1).then(|| y.clone())
}

// ---- linear sums ----

/// An integer ADD, SUB, NEG or MUL by a constant rebuilt from its linear form (terms in atom
/// creation order, like terms combined, the constant last).
fn canonical_linear_sum(u: &UOp) -> Option<UOp> {
    if !u.dtype().is_int() || !is_linear_op(u) {
        return None;
    }
    let rebuilt = LinearForm::of(u)?.build(u.dtype());
    (rebuilt != *u).then_some(rebuilt)
}

/// `(x // c) * (c*k) + (x % c) * k == x * k` inside a sum (for any `x`: truncating division
/// and the remainder with the dividend's sign recombine exactly), the form a reshape's index
/// takes when a flat offset is split into axes and joined again.
fn div_mod_recombine(u: &UOp) -> Option<UOp> {
    if !u.dtype().is_int() {
        return None;
    }
    let mut lin = LinearForm::of(u)?;
    let pair = lin.terms.iter().enumerate().find_map(|(a, (quot, kq))| {
        let (BinaryOp::IDiv, x, c) = quot.as_binary()? else { return None };
        let c = c.const_int().filter(|&c| c > 0)?;
        lin.terms.iter().enumerate().find_map(|(b, (rem, kr))| {
            let (BinaryOp::Mod, y, d) = rem.as_binary()? else { return None };
            (y == x && d.const_int() == Some(c) && c.checked_mul(*kr) == Some(*kq))
                .then(|| (a, b, x.clone(), *kr))
        })
    });
    let (a, b, x, k) = pair?;
    lin.terms.remove(a.max(b));
    lin.terms.remove(a.min(b));
    lin.add(&x, k)?;
    lin.normalize();
    Some(lin.build(u.dtype()))
}

// ---- division and modulo ----

/// `(x, c)` for an integer IDIV or MOD `x op c` by a constant `c`.
fn by_constant(u: &UOp) -> Option<(&UOp, i64)> {
    if !u.dtype().is_int() {
        return None;
    }
    let (_, x, c) = u.as_binary()?;
    Some((x, c.const_int()?))
}

/// `(x, c)` for `x op c` with a constant `c > 1` and `x >= 0`: the rules that split linear
/// forms apply only here.
fn by_constant_above_one(u: &UOp) -> Option<(&UOp, i64)> {
    by_constant(u).filter(|&(x, c)| c > 1 && x.vmin() >= 0)
}

/// `x // 1 == x`.
fn idiv_by_one(u: &UOp) -> Option<UOp> {
    by_constant(u).filter(|&(_, c)| c == 1).map(|(x, _)| x.clone())
}

/// `x % 1 == 0`.
fn mod_by_one(u: &UOp) -> Option<UOp> {
    by_constant(u).filter(|&(_, c)| c == 1).map(|_| konst(0, u.dtype()))
}

/// `(y, a)` when `x` is `y // a` with `y >= 0` and a constant `a > 0`.
fn nonnegative_idiv(x: &UOp) -> Option<(&UOp, i64)> {
    match x.as_binary()? {
        (BinaryOp::IDiv, y, a) => {
            let a = a.const_int()?;
            (a > 0 && y.vmin() >= 0).then_some((y, a))
        }
        _ => None,
    }
}

/// `(y // a) // c == y // (a*c)` for `y >= 0` and `a, c > 0` (not applied if `a*c` overflows).
fn idiv_of_idiv(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    let (y, a) = nonnegative_idiv(x)?;
    Some(y.binary(BinaryOp::IDiv, konst(a.checked_mul(c)?, u.dtype())))
}

/// `x // c` with `x = q*c + r` (the terms of `x`'s linear form whose coefficients `c` divides
/// and the multiple of `c` in its constant, and the rest): `q + r // c`, and just `q + k` when
/// `r`'s bounds give `r // c` one value `k`.
/// Needs `r >= 0`. Not applied where [`idiv_of_idiv`]'s pattern holds.
fn idiv_split_linear(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    if nonnegative_idiv(x).is_some() {
        return None;
    }
    let d = u.dtype();
    let (mut quot, rem) = LinearForm::of(x)?.split_by(c);
    let (rlo, rhi) = rem.bounds();
    if rlo >= 0 && rlo / c == rhi / c {
        quot.constant += rlo / c;
        return Some(quot.build(d));
    }
    // A quotient of the constant alone counts too: `(i + 768) // 64` is `12 + i // 64`.
    if (!quot.terms.is_empty() || quot.constant != 0) && rlo >= 0 {
        let q = quot.build(d);
        return Some(q.binary(BinaryOp::Add, rem.build(d).binary(BinaryOp::IDiv, konst(c, d))));
    }
    None
}

/// `x = g*y + r` for a common factor `g > 1` of `c` and of some of `x`'s terms, with
/// `0 <= r < g` (`r` the other terms and the constant's remainder): `(y, g)`, the largest such
/// `g`. Then `x // c == y // (c/g)` and `x % c == (y % (c/g)) * g + r` for `x >= 0`.
fn common_factor(x: &UOp, c: i64) -> Option<(LinearForm, LinearForm, i64)> {
    let lin = LinearForm::of(x)?;
    let mut factors: Vec<i64> =
        lin.terms.iter().map(|(_, k)| gcd(c, *k)).filter(|&g| g > 1 && g < c).collect();
    factors.sort_unstable_by(|a, b| b.cmp(a));
    factors.dedup();
    factors.into_iter().find_map(|g| {
        let (y, r) = lin.split_by(g);
        let (lo, hi) = r.bounds();
        (lo >= 0 && hi < g).then_some((y, r, g))
    })
}

fn gcd(mut a: i64, mut b: i64) -> i64 {
    (a, b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `(g*y + r) // c == y // (c/g)` for `x = g*y + r >= 0` with `0 <= r < g` and `g` dividing
/// `c` ([`common_factor`]): a flat offset over a split axis divided by the product of the
/// axes inside it.
fn idiv_common_factor(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    let (y, _, g) = common_factor(x, c)?;
    Some(y.build(u.dtype()).binary(BinaryOp::IDiv, konst(c / g, u.dtype())))
}

/// `(g*y + r) % c == (y % (c/g)) * g + r` under [`idiv_common_factor`]'s conditions.
fn mod_common_factor(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    let (y, r, g) = common_factor(x, c)?;
    let d = u.dtype();
    let high = y.build(d).binary(BinaryOp::Mod, konst(c / g, d)).binary(BinaryOp::Mul, konst(g, d));
    Some(high.binary(BinaryOp::Add, r.build(d)))
}

/// `x % c == x` when `0 <= x < c`.
fn mod_of_small_operand(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    let (lo, hi) = x.bounds();
    (lo >= 0 && hi < c).then(|| x.clone())
}

/// `x % c` with the terms of `x` that `c` divides dropped and the constant reduced mod `c`:
/// the remainder `r` itself when `0 <= r < c`, else `r % c` if anything was dropped.
fn mod_drop_multiples(u: &UOp) -> Option<UOp> {
    let (x, c) = by_constant_above_one(u)?;
    let d = u.dtype();
    let lin = LinearForm::of(x)?;
    let (_, rem) = lin.split_by(c);
    let (rlo, rhi) = rem.bounds();
    if rlo >= 0 && rhi < c {
        return Some(rem.build(d));
    }
    if rlo >= 0 && (rem.terms.len() < lin.terms.len() || rem.constant != lin.constant) {
        return Some(rem.build(d).binary(BinaryOp::Mod, konst(c, d)));
    }
    None
}

/// `(x, y)` for an integer `x op y` with a divisor that is not a constant, `0 <= x` and
/// `x < y` for all values in their bounds. (Constant divisors are the rules above's.)
fn smaller_than_divisor(u: &UOp) -> Option<&UOp> {
    let (_, x, y) = u.as_binary()?;
    (u.dtype().is_int() && y.const_int().is_none() && x.vmin() >= 0 && x.vmax() < y.vmin()).then_some(x)
}

/// `x // y == 0` when `0 <= x < y`.
fn idiv_by_larger_divisor(u: &UOp) -> Option<UOp> {
    smaller_than_divisor(u).map(|_| konst(0, u.dtype()))
}

/// `x % y == x` when `0 <= x < y`.
fn mod_by_larger_divisor(u: &UOp) -> Option<UOp> {
    smaller_than_divisor(u).cloned()
}
