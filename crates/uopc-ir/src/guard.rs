//! Loop bounds read off guards: where a condition over a loop variable stops holding.
//!
//! A masked computation `where(keep(i, j), x, masked)` over a loop `j` need not visit the
//! iterations where `keep` is false. When `keep` is an integer comparison that is linear in
//! `j` (a causal mask `j <= i + c`, the end of a sliding window), [`guard_end`] gives an
//! expression `E` free of `j` with `keep` false for every `j >= E`, so the loop can end at `E`.
//! Anything the analysis does not understand gives `None` (no bound), never a wrong one.

use crate::dtype::DType;
use crate::ops::{BinaryOp, ConstValue, UnaryOp};
use crate::uop::UOp;
use crate::{idx, view::WhereView};

/// `expr` as `coef * var + rest`, `rest` free of `var`, when `expr` is an integer expression
/// built of constants, other free terms, `+`, `-`, negation, products with a constant and
/// integer-to-integer casts of such expressions (casts that cannot wrap: into I64, or of a
/// value the bounds say fits).
///
/// ```rust
/// use uopc_ir::{AxisType, IndexFormula, linear_in, range};
///
/// let (i, j) = (range(8, 0, AxisType::Loop), range(16, 1, AxisType::Loop));
/// let (coef, rest) = linear_in(&(&i + 3 - &j * 2), &j).expect("linear in j");
/// assert_eq!(coef, -2);
/// // the rest is i + 3, free of j
/// assert_eq!(IndexFormula::over_ranges(&rest, &[i]).and_then(|f| f.eval(&[4])), Some(7));
/// assert!(linear_in(&(&j * &j), &j).is_none(), "not linear");
/// ```
pub fn linear_in(expr: &UOp, var: &UOp) -> Option<(i64, UOp)> {
    if !is_integer(expr.dtype()) {
        return None;
    }
    if expr == var {
        return Some((1, idx(0)));
    }
    if !mentions(expr, var) {
        return Some((0, expr.clone()));
    }
    if let Some((UnaryOp::Neg, a)) = expr.as_unary() {
        let (c, r) = linear_in(a, var)?;
        return Some((c.checked_neg()?, -r));
    }
    if let Some(x) = expr.as_cast() {
        let fits = expr.dtype() == DType::I64 || x.dtype() == DType::I32;
        return if is_integer(x.dtype()) && fits { linear_in(x, var) } else { None };
    }
    let (op, a, b) = expr.as_binary()?;
    match op {
        BinaryOp::Add | BinaryOp::Sub => {
            let ((ca, ra), (cb, rb)) = (linear_in(a, var)?, linear_in(b, var)?);
            if op == BinaryOp::Add {
                Some((ca.checked_add(cb)?, ra + rb))
            } else {
                Some((ca.checked_sub(cb)?, ra - rb))
            }
        }
        BinaryOp::Mul => {
            let (k, x) = match (a.const_int(), b.const_int()) {
                (Some(k), _) => (k, b),
                (_, Some(k)) => (k, a),
                _ => return None,
            };
            let (c, r) = linear_in(x, var)?;
            Some((c.checked_mul(k)?, r * k))
        }
        _ => None,
    }
}

/// Whether `e` reads `var`.
fn mentions(e: &UOp, var: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(e)).contains(var)
}

fn is_integer(d: DType) -> bool {
    matches!(d, DType::I32 | DType::I64)
}

/// The end of the iterations of loop variable `var` (a RANGE, so never negative) for which
/// `guard` holds: an expression free of `var` such that `guard` is false, or zero for a
/// numeric guard, whenever `var >= end`. `None` when no such bound can be read off the guard.
///
/// Understood forms: integer comparisons `a < b` with `a - b` linear in `var` with a positive
/// coefficient, and their negations; a numeric guard's `x != 0` and casts of a bool or an
/// integer; a product of guards (zero when either is); `where(c, x, y)` with one arm a constant;
/// constants (a false constant ends the loop at 0).
///
/// ```rust
/// use uopc_ir::{AxisType, DType, IndexFormula, boolc, guard_end, range};
///
/// // keep(i, j) = !(i + 4 < j): a causal mask shifted by 4 keys
/// let (i, j) = (range(8, 0, AxisType::Loop), range(16, 1, AxisType::Loop));
/// let keep = (&i + 4).lt(&j).where_(boolc(false), boolc(true)).cast(DType::F32);
/// let end = guard_end(&keep, &j).expect("j <= i + 4");
/// // at i = 2 the guard holds for j < 7
/// assert_eq!(IndexFormula::over_ranges(&end, &[i]).and_then(|f| f.eval(&[2])), Some(7));
/// ```
pub fn guard_end(guard: &UOp, var: &UOp) -> Option<UOp> {
    end_where(guard, var, true, Bound::Upper)
}

/// The exact end of the iterations of RANGE `var` for which `guard` holds: an expression `end`
/// free of `var` with `guard` true (nonzero) for every `var < end` and false for every `var >=
/// end`, when `guard` is such a prefix condition in the forms [`guard_end`] understands
/// (comparisons with coefficient 1, products and `where`s of exact guards); `None` otherwise.
///
/// ```rust
/// use uopc_ir::{AxisType, DType, boolc, guard_exact_end, range};
///
/// let (i, j) = (range(8, 0, AxisType::Loop), range(16, 1, AxisType::Loop));
/// let causal = (&i + 4).lt(&j).where_(boolc(false), boolc(true));
/// assert!(guard_exact_end(&causal, &j).is_some());
/// // 2 j < i is a prefix in j, but its end is read off only as a bound
/// assert!(guard_exact_end(&(&j * 2).lt(&i), &j).is_none());
/// ```
pub fn guard_exact_end(guard: &UOp, var: &UOp) -> Option<UOp> {
    end_where(guard, var, true, Bound::Exact)
}

/// What an end read off a guard promises.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// The guard is false from the end on.
    Upper,
    /// ... and true before it.
    Exact,
}

/// The end of the `var` iterations for which `e`'s truth (nonzero for a number) is `want`.
fn end_where(e: &UOp, var: &UOp, want: bool, bound: Bound) -> Option<UOp> {
    if let Some(c) = e.const_value() {
        // an always-true guard has no end to give
        return (truth(c) != want).then(|| idx(0));
    }
    if !mentions(e, var) {
        return None;
    }
    if let Some(x) = e.as_cast() {
        let keeps_zero = x.dtype() == DType::Bool || is_integer(x.dtype());
        return if keeps_zero { end_where(x, var, want, bound) } else { None };
    }
    if let Some(w) = e.as_where() {
        return where_end(&w, var, want, bound);
    }
    let (op, a, b) = e.as_binary()?;
    match op {
        BinaryOp::CmpLt if a.dtype() == DType::I64 => {
            // a < b is a - b < 0; its negation b - a <= 0 is b - a - 1 < 0 on integers
            let diff = if want { a - b } else { b - a - 1 };
            let (coef, rest) = linear_in(&diff, var)?;
            // coef * var < -rest for var < ceil(-rest / coef); rounding toward zero can only
            // move a negative end up, which is still an end
            match bound {
                Bound::Exact => (coef == 1).then(|| -rest),
                Bound::Upper => (coef > 0).then(|| (-rest + (coef - 1)).idiv(coef)),
            }
        }
        BinaryOp::CmpNe => {
            let x = match (a.const_value().map(truth), b.const_value().map(truth)) {
                (_, Some(false)) => a,
                (Some(false), _) => b,
                _ => return None,
            };
            end_where(x, var, want, bound)
        }
        BinaryOp::Mul if want && exact_product(a, b) => {
            // nonzero only where both factors are
            min_end(end_where(a, var, true, bound), end_where(b, var, true, bound), bound)
        }
        _ => None,
    }
}

/// [`end_where`] of `where(cond, then, otherwise)`.
fn where_end(w: &WhereView<'_>, var: &UOp, want: bool, bound: Bound) -> Option<UOp> {
    let arm = |x: &UOp| x.const_value().map(|c| truth(c) == want);
    let end = |x: &UOp, want: bool| end_where(x, var, want, bound);
    match (arm(w.then), arm(w.otherwise)) {
        // `cond` and `then`; when `then` is the constant true, `cond` alone
        (Some(true), Some(false)) => end(w.cond, true),
        (Some(false), Some(true)) => end(w.cond, false),
        (_, Some(false)) => min_end(end(w.cond, true), end(w.then, want), bound),
        (Some(false), _) => min_end(end(w.cond, false), end(w.otherwise, want), bound),
        // `cond` fails or `then` holds: a prefix only as a bound, both ending
        _ if bound == Bound::Exact => None,
        (_, Some(true)) => max_end(end(w.cond, false), end(w.then, want)),
        (Some(true), _) => max_end(end(w.cond, true), end(w.otherwise, want)),
        (None, None) => max_end(end(w.then, want), end(w.otherwise, want)),
    }
}

/// Whether `a * b` is zero exactly when a factor is: integers, or floats where both factors
/// are finite and one is 0 or 1 (in float, `0 * inf` is NaN, which is not zero).
fn exact_product(a: &UOp, b: &UOp) -> bool {
    if !a.dtype().is_float() {
        return true;
    }
    (zero_one(a) && finite(b)) || (zero_one(b) && finite(a))
}

/// Whether every value of `u` is 0 or 1: a bool, a cast of one, or a product of such.
fn zero_one(u: &UOp) -> bool {
    if u.dtype() == DType::Bool {
        return true;
    }
    if let Some(c) = u.const_value() {
        return matches!(c.as_f64(), 0.0 | 1.0);
    }
    match (u.as_cast(), u.as_binary()) {
        (Some(x), _) => zero_one(x),
        (_, Some((BinaryOp::Mul, a, b))) => zero_one(a) && zero_one(b),
        _ => false,
    }
}

/// Whether `u` is never infinite or NaN: an integer or bool, a cast of one, a 0/1 value, or a
/// finite constant.
fn finite(u: &UOp) -> bool {
    !u.dtype().is_float()
        || zero_one(u)
        || u.const_value().is_some_and(|c| c.as_f64().is_finite())
        || u.as_cast().is_some_and(|x| !x.dtype().is_float())
}

/// A constant's truth: nonzero.
fn truth(c: ConstValue) -> bool {
    c.as_f64() != 0.0
}

/// The end of a conjunction: the earlier of two ends, either being enough for a bound (an
/// exact end needs both).
fn min_end(a: Option<UOp>, b: Option<UOp>, bound: Bound) -> Option<UOp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(-(-a).maximum(-b)),
        (a, b) if bound == Bound::Upper => a.or(b),
        _ => None,
    }
}

/// The later of two ends, both being needed.
fn max_end(a: Option<UOp>, b: Option<UOp>) -> Option<UOp> {
    Some(a?.maximum(b?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AxisType, IndexFormula, boolc, range};

    fn ij() -> (UOp, UOp) {
        (range(8, 0, AxisType::Loop), range(16, 1, AxisType::Loop))
    }

    /// The end at `i = at`, as a number.
    fn end_at(end: &UOp, i: &UOp, at: i64) -> i64 {
        let f = IndexFormula::over_ranges(end, std::slice::from_ref(i)).expect("an integer end of i");
        f.eval(&[at]).expect("a value")
    }

    /// Checks `end` against the (integer or bool) guard evaluated at every (i, j): false for
    /// every j >= end.
    fn check_sound(guard: &UOp, end: &UOp, i: &UOp, j: &UOp) {
        let as_int = if guard.dtype() == DType::Bool { guard.cast(DType::I64) } else { guard.clone() };
        let g = IndexFormula::over_ranges(&as_int, &[i.clone(), j.clone()]).expect("an integer guard");
        for a in 0..8 {
            let e = end_at(end, i, a);
            for b in e.max(0)..16 {
                assert_eq!(g.eval(&[a, b]), Some(0), "guard holds at i = {a}, j = {b} past the end {e}");
            }
        }
    }

    #[test]
    fn linear_forms_and_refusals() {
        let (i, j) = ij();
        let (c, r) = linear_in(&(-(&j * 3) + &i), &j).unwrap();
        assert_eq!(c, -3);
        assert_eq!(end_at(&r, &i, 5), 5);
        assert_eq!(linear_in(&j.cast(DType::I32), &j).map(|p| p.0), None, "I64 to I32 may wrap");
        assert_eq!(linear_in(&j.cast(DType::F32), &j).map(|p| p.0), None, "not an integer");
        assert!(linear_in(&j.idiv(2), &j).is_none(), "division is not linear");
    }

    #[test]
    fn causal_guards_end_at_the_diagonal() {
        let (i, j) = ij();
        // j <= i + 2, written as !(i + 2 < j), as a 0/1 float, and as a product with an
        // unanalysable data-like factor (the loaded padding mask of a real kernel)
        let keep = (&i + 2).lt(&j).where_(boolc(false), boolc(true));
        let end = guard_end(&keep, &j).unwrap();
        assert_eq!(end_at(&end, &i, 0), 3);
        assert_eq!(end_at(&end, &i, 7), 10);
        check_sound(&keep, &end, &i, &j);
        let as_float = keep.cast(DType::F32);
        let other = (&i * 5).modulo(3);
        let both = &as_float * &other.cast(DType::F32);
        let end = guard_end(&both.ne(0.0f32), &j).unwrap();
        assert_eq!(end_at(&end, &i, 4), 7);
        check_sound(&(keep.cast(DType::I64) * &other), &end, &i, &j);
        // j < 2 i + 1 directly, and the intersection of two ends
        let lt = j.lt(&i * 2 + 1);
        assert_eq!(end_at(&guard_end(&lt, &j).unwrap(), &i, 3), 7);
        let two = lt.where_(&keep, boolc(false));
        let end = guard_end(&two, &j).unwrap();
        assert_eq!(end_at(&end, &i, 1), 3, "min(2 i + 1, i + 3) at i = 1");
        assert_eq!(end_at(&end, &i, 5), 8, "min(2 i + 1, i + 3) at i = 5");
        check_sound(&two, &end, &i, &j);
    }

    /// Checks an exact `end`: the guard holds for every j below it and fails from it on.
    fn check_exact(guard: &UOp, end: &UOp, i: &UOp, j: &UOp) {
        let as_int = if guard.dtype() == DType::Bool { guard.cast(DType::I64) } else { guard.clone() };
        let g = IndexFormula::over_ranges(&as_int, &[i.clone(), j.clone()]).expect("an integer guard");
        for a in 0..8 {
            let e = end_at(end, i, a);
            for b in 0..16 {
                assert_eq!(g.eval(&[a, b]) != Some(0), b < e, "at i = {a}, j = {b}, end {e}");
            }
        }
    }

    #[test]
    fn exact_ends_are_prefixes() {
        let (i, j) = ij();
        let causal = (&i + 2).lt(&j).where_(boolc(false), boolc(true));
        check_exact(&causal, &guard_exact_end(&causal, &j).unwrap(), &i, &j);
        let band = j.lt(&i * 2 + 1).where_(&causal, boolc(false));
        check_exact(&band, &guard_exact_end(&band, &j).unwrap(), &i, &j);
        let f = causal.cast(DType::F32) * j.lt(&i + 5).cast(DType::F32);
        let end = guard_exact_end(&f.ne(0.0f32), &j).unwrap();
        check_exact(&(causal.cast(DType::I64) * j.lt(&i + 5).cast(DType::I64)), &end, &i, &j);
        // a factor without an end: still an upper bound, not exact
        let data = crate::buffer(0, DType::Bool, 16).index(&j).load();
        let masked = causal.where_(&data, boolc(false));
        assert!(guard_end(&masked, &j).is_some());
        assert!(guard_exact_end(&masked, &j).is_none());
        assert!(guard_exact_end(&(&j * 3).lt(&i + 7), &j).is_none(), "rounded: a bound only");
    }

    #[test]
    fn coefficients_above_one_round_up() {
        let (i, j) = ij();
        // 3 j < i + 7: j < (i + 7) / 3, true up to ceil
        let g = (&j * 3).lt(&i + 7);
        let end = guard_end(&g, &j).unwrap();
        assert_eq!(end_at(&end, &i, 0), 3);
        assert_eq!(end_at(&end, &i, 2), 3);
        assert_eq!(end_at(&end, &i, 3), 4);
        check_sound(&g, &end, &i, &j);
    }

    #[test]
    fn guards_without_an_end_are_refused() {
        let (i, j) = ij();
        // j >= i: a lower bound, no end
        assert!(guard_end(&j.lt(&i).where_(boolc(false), boolc(true)), &j).is_none());
        // a float comparison, a data-like modulo, an OR of two guards that lacks an end
        assert!(guard_end(&j.cast(DType::F32).lt(3.0f32), &j).is_none());
        assert!(guard_end(&j.modulo(4).lt(2), &j).is_none());
        // a float factor that may be inf or NaN: 0 * inf is NaN, a true guard
        let keep = (&i + 2).lt(&j).where_(boolc(false), boolc(true)).cast(DType::F32);
        let data = crate::buffer(0, DType::F32, 16).index(&j).load();
        assert!(guard_end(&(&keep * &data).ne(0.0f32), &j).is_none());
        assert!(guard_end(&(&keep * (&i * 3).cast(DType::F32)).ne(0.0f32), &j).is_some());
        let either = j.lt(3).where_(boolc(true), i.lt(2));
        assert!(guard_end(&either, &j).is_none(), "true whenever i < 2, for every j");
        // a guard that does not mention j has no end, a false constant ends at 0
        assert!(guard_end(&i.lt(3), &j).is_none());
        assert_eq!(guard_end(&boolc(false), &j).and_then(|e| e.const_int()), Some(0));
    }
}
