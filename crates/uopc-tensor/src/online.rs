//! Online reductions: a sum that waits for a maximum over the same axis is rewritten to carry a
//! running maximum instead, so both are computed in one pass over the axis.
//!
//! Softmax, logsumexp, log-softmax and cross-entropy all sum `exp(x_j - g(m)) * f_j`, where
//! `m = max_j y_j` is a reduction over the axis being summed. Computed as written, the sum needs
//! the finished maximum, so the axis is read twice (and, fully fused, every value of `x` that
//! depends on a product is recomputed for each pass). Two rules make the one-pass form:
//!
//! - `hoist_invariant_factors` (distributivity, `sum_j a * b_j = a * sum_j b_j`): factors of a
//!   summand that do not vary along the summed axes leave the sum. Softmax-weighted sums divide
//!   by the normalizer, itself a sum over the same axis; once the division is outside, the two
//!   sums no longer wait for each other.
//! - `rescale_by_running_max` (`exp(u - w) = exp(u - v) * exp(v - w)`): a sum whose summand is
//!   `exp2(k * (t - h)) * f`, with `k > 0`, `h` a function of one maximum `m` over the same
//!   axis extents and invariant along the summed axes, `t` (a view of) `m`'s own input and `f`
//!   independent of `m`, is
//!   marked as an online sum of `m`. Rangeify then keeps `m`'s running value next to the sum's
//!   accumulator and, whenever it grows from `m0` to `m1`, multiplies the accumulator by
//!   `exp2(k * (g(m0) - g(m1)))` before adding the new term (computed with `m1`). At the end
//!   the running value is the maximum, so the result is the sum as written; only the rounding
//!   differs. The identity holds for any function `g`, which is why the finite shift of
//!   logsumexp (`m` where finite, else 0) qualifies as well as softmax's plain `m`.
//!
//! Everything else is left as it is: a maximum reached through anything but that one
//! exponential factor (`sum_j (x_j - m)`, say) has no rescaling law here.
//!
//! An online sum is a REDUCE with four sources, `[summand, m, g(m), k]` (see [`OnlineSum`]);
//! the last three only tell rangeify how to rescale.

use crate::view::movement_source_index;
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use uopc_ir::{
    AxisType, BinaryOp, Op, Pass, Pattern, ReduceOp, Revisit, Rule, RuleTable, UOp, UnaryOp, range,
};

/// The parts of an online sum: `sum_j summand_j` where the summand's one exponential factor
/// shifts by `shift`, a function of the maximum `max`, scaled by `scale` inside `exp2`.
#[derive(Clone, Debug)]
pub(crate) struct OnlineSum {
    /// The summand, as written (it reads `max` through `shift`).
    pub summand: UOp,
    /// The REDUCE MAX whose running value the accumulator follows.
    pub max: UOp,
    /// `g(max)`, the node the exponent subtracts (max-shaped).
    pub shift: UOp,
    /// `k` of `exp2(k * (t - g(max)))`, a positive 0-d constant.
    pub scale: UOp,
}

impl OnlineSum {
    /// The online sum `u` is, if it is one (a marked REDUCE whose maximum is still a REDUCE:
    /// once the maximum is materialized by another kernel it is only an input, and the sum is
    /// an ordinary one).
    pub(crate) fn of(u: &UOp) -> Option<OnlineSum> {
        let reduce = u.as_reduce().filter(|r| r.op == ReduceOp::Add)?;
        let online = reduce.online?;
        matches!(online.max.op(), Op::Reduce { op: ReduceOp::Max, .. }).then(|| OnlineSum {
            summand: reduce.input.clone(),
            max: online.max.clone(),
            shift: online.shift.clone(),
            scale: online.scale.clone(),
        })
    }
}

static ONLINE: LazyLock<RuleTable> = LazyLock::new(|| {
    let reduce = Op::Reduce { op: ReduceOp::Add, axes: 1 };
    RuleTable::new(
        "online_reductions",
        vec![
            Rule::new(
                "hoist_invariant_factors",
                Pattern::ops(std::slice::from_ref(&reduce)),
                hoist_invariant_factors,
            ),
            Rule::new("rescale_by_running_max", Pattern::ops(&[reduce]), rescale_by_running_max),
        ],
    )
});
// Fixpoint: the sum left after hoisting is itself a candidate for the second rule.
static ONLINE_PASS: LazyLock<Pass<'static>> =
    LazyLock::new(|| Pass::new("online_reductions", vec![&*ONLINE], Revisit::Fixpoint { max_rounds: 4 }));

/// `roots` with every sum that qualifies rewritten to its online form (see the module docs).
pub fn online_reductions(roots: &[UOp]) -> Vec<UOp> {
    crate::passes::run_pass(&ONLINE_PASS, roots, &mut ())
}

/// How many online sums `body` holds.
pub(crate) fn online_sums_in(body: &UOp) -> usize {
    UOp::toposort(std::slice::from_ref(body)).iter().filter(|u| OnlineSum::of(u).is_some()).count()
}

/// The REDUCEs an online group computes in its loop: its online sums, their maxima and every
/// reduce their summands and maxima read. Fused into one pass over the summed axis, each of
/// them reads one row of its operands at a time, so a layout copy that makes another axis
/// contiguous would only cost a pass.
pub(crate) fn grouped_reduces(roots: &[UOp]) -> HashSet<UOp> {
    let mut heads = Vec::new();
    for u in UOp::toposort(roots) {
        if let Some(o) = OnlineSum::of(&u) {
            heads.extend([u.clone(), o.max.clone()]);
        }
    }
    UOp::toposort(&heads).into_iter().filter(|u| matches!(u.op(), Op::Reduce { .. })).collect()
}

/// A plain (one-source) float sum's summand and the number of trailing axes it sums.
fn plain_sum(u: &UOp) -> Option<(&UOp, usize)> {
    let Op::Reduce { op: ReduceOp::Add, axes } = u.op() else { return None };
    let [summand] = u.src() else { return None };
    u.dtype().is_float().then_some((summand, *axes))
}

/// Symbolic indices for a tensor of `shape`: one fresh RANGE per axis. They are only compared,
/// never lowered, so their ids need only differ from each other.
pub(crate) fn symbolic_index(shape: &[usize]) -> Vec<UOp> {
    shape.iter().enumerate().map(|(k, &s)| range(s.max(1), usize::MAX - k, AxisType::Loop)).collect()
}

/// Whether the value of `u` at `index` changes with any range in `along`: ALU ops depend on
/// what their sources do, movement ops on the index they read, and anything else (a buffer, a
/// reduce, a stage) on whether its index mentions one of them.
fn varies_along(
    u: &UOp,
    index: &[UOp],
    along: &HashSet<UOp>,
    memo: &mut HashMap<(UOp, Vec<UOp>), bool>,
) -> bool {
    let key = (u.clone(), index.to_vec());
    if let Some(&v) = memo.get(&key) {
        return v;
    }
    let mentions = |i: &[UOp]| i.iter().flat_map(|x| x.ranges_mentioned()).any(|r| along.contains(&r));
    let v = if let Some(viewed) = u.as_movement() {
        let inner = movement_source_index(u, index);
        let inner: Vec<UOp> = inner.iter().map(uopc_ir::simplify).collect();
        varies_along(viewed, &inner, along, memo)
    } else if let Some(x) = u.as_detach() {
        varies_along(x, index, along, memo)
    } else {
        match u.op() {
            Op::Const(_) => false,
            // Generic over the operands: any one that varies makes the result vary.
            op if op.is_alu() => {
                u.src().iter().any(|s| !s.shape().is_empty() && varies_along(s, index, along, memo))
            }
            _ => mentions(index),
        }
    };
    memo.insert(key, v);
    v
}

/// The factors of product `f`: `f` is their product. Movement views over a product are pushed
/// into its operands (a view of `a * b` is the view of `a` times the view of `b`), so factors
/// hidden under a broadcast of a softmax are found.
fn factors(f: &UOp) -> Vec<UOp> {
    let mut out = Vec::new();
    let mut todo = vec![f.clone()];
    while let Some(u) = todo.pop() {
        if let Op::Binary(BinaryOp::Mul) = u.op() {
            todo.extend(u.src().iter().rev().cloned());
            continue;
        }
        let (chain, base) = crate::view::movement_chain(&u);
        let product = match base.as_binary() {
            Some((BinaryOp::Mul, a, b)) if !chain.is_empty() => Some((a, b)),
            _ => None,
        };
        let pushable =
            product.filter(|(a, b)| [a, b].iter().all(|s| s.shape() == base.shape() || is_scalar_const(s)));
        if let Some((a, b)) = pushable {
            let moved = |s: &UOp| {
                if is_scalar_const(s) { s.clone() } else { crate::view::reapply(&chain, s.clone()) }
            };
            let (a, b) = (moved(a), moved(b));
            todo.push(UOp::new(Op::Binary(BinaryOp::Mul), u.dtype(), vec![a, b]));
            continue;
        }
        out.push(u);
    }
    out
}

fn is_scalar_const(u: &UOp) -> bool {
    matches!(u.op(), Op::Const(_)) && u.shape().is_empty()
}

/// The product of `fs` (non-empty), in order.
fn product(fs: &[UOp]) -> UOp {
    let d = fs[0].dtype();
    fs[1..].iter().fold(fs[0].clone(), |acc, f| UOp::new(Op::Binary(BinaryOp::Mul), d, vec![acc, f.clone()]))
}

/// The ranges of `index`'s last `axes` entries, as a set.
fn trailing(index: &[UOp], axes: usize) -> HashSet<UOp> {
    index[index.len() - axes..].iter().cloned().collect()
}

/// `sum(a * b)` with `b` invariant along the summed axes becomes `sum(a) * b`, `b` read at
/// the first position of those axes (any position holds the same value).
fn hoist_invariant_factors(u: &UOp) -> Option<UOp> {
    let (summand, axes) = plain_sum(u)?;
    let fs = factors(summand);
    if fs.len() < 2 {
        return None;
    }
    let index = symbolic_index(summand.shape());
    let along = trailing(&index, axes);
    let mut memo = HashMap::new();
    let (mut variant, mut invariant) = (Vec::new(), Vec::new());
    for f in fs {
        if !is_scalar_const(&f) && !varies_along(&f, &index, &along, &mut memo) {
            invariant.push(f);
        } else {
            variant.push(f);
        }
    }
    if invariant.is_empty() || variant.iter().all(is_scalar_const) {
        return None;
    }
    let d = u.dtype();
    let shape = summand.shape();
    let sum = UOp::new(Op::Reduce { op: ReduceOp::Add, axes }, d, vec![product(&variant)]);
    let bounds: Vec<(usize, usize)> = shape
        .iter()
        .enumerate()
        .map(|(k, &s)| if k + axes >= shape.len() { (0, 1) } else { (0, s) })
        .collect();
    let first = UOp::new(Op::Shrink(bounds), d, vec![product(&invariant)]);
    let hoisted = UOp::new(Op::Reshape(u.shape().to_vec()), d, vec![first]);
    Some(UOp::new(Op::Binary(BinaryOp::Mul), d, vec![sum, hoisted]))
}

/// Every REDUCE MAX `u` reads without passing through another REDUCE.
fn maxima_read(u: &UOp) -> HashSet<UOp> {
    let mut found = HashSet::new();
    let mut seen = HashSet::new();
    let mut todo = vec![u.clone()];
    while let Some(x) = todo.pop() {
        if !seen.insert(x.clone()) {
            continue;
        }
        match x.op() {
            Op::Reduce { op: ReduceOp::Max, .. } => {
                found.insert(x);
            }
            Op::Reduce { .. } | Op::Custom(_) | Op::Stage => {}
            _ => todo.extend(x.src().iter().cloned()),
        }
    }
    found
}

/// Whether `g` is computed from `max` and constants alone by elementwise ops and RESHAPEs (a
/// kept axis of size 1), with as many elements as `max`: then `g` reshaped to `max`'s shape,
/// read at `max`'s index, is `g` of `max` there.
fn elementwise_of(g: &UOp, max: &UOp) -> bool {
    if crate::util::numel(g.shape()) != crate::util::numel(max.shape()) {
        return false;
    }
    let mut todo = vec![g.clone()];
    let mut seen = HashSet::new();
    while let Some(x) = todo.pop() {
        if x == *max || !seen.insert(x.clone()) {
            continue;
        }
        match x.op() {
            Op::Const(_) => {}
            op if op.is_alu() || matches!(op, Op::Detach | Op::Reshape(_)) => {
                todo.extend(x.src().iter().cloned())
            }
            _ => return false,
        }
    }
    true
}

/// `exp2(k * (t - h))` (either operand order of the product) as `(t, h, k)`, `k` a positive
/// 0-d constant.
pub(crate) fn shifted_exp2(e: &UOp) -> Option<(UOp, UOp, UOp)> {
    let (UnaryOp::Exp2, z) = e.as_unary()? else { return None };
    let (BinaryOp::Mul, a, b) = z.as_binary()? else { return None };
    let (diff, k) = if is_scalar_const(b) { (a, b) } else { (b, a) };
    if !is_scalar_const(k) || k.const_value()?.as_f64() <= 0.0 {
        return None;
    }
    let (BinaryOp::Sub, t, h) = diff.as_binary()? else { return None };
    Some((t.clone(), h.clone(), k.clone()))
}

/// Marks `sum(exp2(k * (t - g(m))) * f)` as an online sum of `m` when the law of the module
/// docs holds; see there for each condition.
fn rescale_by_running_max(u: &UOp) -> Option<UOp> {
    let (summand, axes) = plain_sum(u)?;
    let fs = factors(summand);
    let reading: Vec<(UOp, HashSet<UOp>)> =
        fs.iter().map(|f| (f.clone(), maxima_read(f))).filter(|(_, m)| !m.is_empty()).collect();
    // One factor reads one maximum: the exponential.
    let [(factor, maxima)] = &reading[..] else { return None };
    if maxima.len() != 1 {
        return None;
    }
    let max = maxima.iter().next()?.clone();
    let max_view = max.as_reduce()?;
    let (max_axes, max_input) = (max_view.axes, max_view.input);
    let y_shape = max_input.shape();
    let s_shape = summand.shape();
    if y_shape[y_shape.len() - max_axes..] != s_shape[s_shape.len() - axes..] {
        return None;
    }
    let (chain, e) = crate::view::movement_chain(factor);
    let (t, h, k) = shifted_exp2(&e)?;
    // The exponent subtracts the maximum of its own input: while that maximum is -inf, so is
    // every term's `t`, and the terms seen before the first finite value are all 0.
    let base = |u: &UOp| crate::view::movement_chain(u).1;
    if base(&t) != base(max_input) {
        return None;
    }
    let (_, shift) = crate::view::movement_chain(&h);
    if !elementwise_of(&shift, &max) {
        return None;
    }
    let shift = if shift.shape() == max.shape() {
        shift
    } else {
        UOp::new(Op::Reshape(max.shape().to_vec()), shift.dtype(), vec![shift])
    };
    // The shift must be the same for every term of one sum: invariant along the summed axes.
    let index = symbolic_index(s_shape);
    let h_at_summand = crate::view::reapply(&chain, h.clone());
    if varies_along(&h_at_summand, &index, &trailing(&index, axes), &mut HashMap::new()) {
        return None;
    }
    let op = Op::Reduce { op: ReduceOp::Add, axes };
    Some(UOp::new(op, u.dtype(), vec![summand.clone(), max, shift, k]))
}
