//! Symbolic simplification with value bounds.
//!
//! Integer expressions get `vmin`/`vmax` bounds from the ranges they mention; with them,
//! `simplify` canonicalizes linear sums and folds division and modulo, proving for example
//! `((i*N + j)//N) % N == i` when `0 <= j < N`. Every "which loops does this depend on"
//! question must be asked of a simplified expression (the chapter's O(N^3) lesson).

use crate::dtype::DType;
use crate::uop::{BinaryOp, ConstValue, Op, UOp, UnaryOp};
use std::collections::HashMap;

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

fn clamp128(v: i128) -> i64 {
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
    let s = |k: usize| u.src()[k].node_bounds().unwrap_or(dtype_bounds(u.src()[k].dtype()));
    let full = dtype_bounds(d);
    let b = match u.op() {
        Op::Const(c) => {
            let v = c.as_i64();
            (v, v)
        }
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
        Op::Cast if !u.src()[0].dtype().is_float() => {
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

/// A linear form `sum(coeff * atom) + constant` of an integer expression.
#[derive(Clone, Debug, Default)]
struct Linear {
    terms: Vec<(UOp, i64)>,
    constant: i64,
}

impl Linear {
    fn of(u: &UOp) -> Option<Linear> {
        let mut lin = Linear::default();
        lin.add(u, 1)?;
        lin.normalize();
        Some(lin)
    }

    /// Adds `coeff * u`, flattening sums with an explicit stack (chains can be very deep).
    fn add(&mut self, u: &UOp, coeff: i64) -> Option<()> {
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

    fn normalize(&mut self) {
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

    fn bounds(&self) -> (i64, i64) {
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

    fn build(&self, dtype: DType) -> UOp {
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
fn konst(v: i64, dtype: DType) -> UOp {
    UOp::new(Op::Const(ConstValue::Int(v).cast(dtype)), dtype, vec![])
}

fn is_linear_op(u: &UOp) -> bool {
    match u.op() {
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) | Op::Unary(UnaryOp::Neg) => true,
        Op::Binary(BinaryOp::Mul) => u.src()[0].const_int().is_some() || u.src()[1].const_int().is_some(),
        _ => false,
    }
}

/// Folds an ALU node whose sources are all constants.
fn fold_const(u: &UOp) -> Option<UOp> {
    let cs: Option<Vec<ConstValue>> = u.src().iter().map(|s| s.const_value()).collect();
    let cs = cs?;
    if cs.is_empty() {
        return None;
    }
    let d = u.dtype();
    let val = match (u.op(), d.is_float() || cs.iter().any(|c| matches!(c, ConstValue::Float(_)))) {
        (Op::Cast, _) => cs[0].cast(d),
        (Op::Where, _) => {
            return Some(if cs[0].as_i64() != 0 { u.src()[1].clone() } else { u.src()[2].clone() });
        }
        (Op::Unary(op), true) => {
            let a = cs[0].as_f64();
            let r = match op {
                UnaryOp::Neg => -a,
                UnaryOp::Recip if d == DType::F32 => (1.0 / a as f32) as f64,
                UnaryOp::Recip => 1.0 / a,
                UnaryOp::Sqrt if d == DType::F32 => (a as f32).sqrt() as f64,
                UnaryOp::Sqrt => a.sqrt(),
                // Transcendentals stay: the backend's approximation is the semantics.
                UnaryOp::Exp2 | UnaryOp::Log2 => return None,
            };
            ConstValue::float(r).cast(d)
        }
        (Op::Unary(UnaryOp::Neg), false) => ConstValue::Int(cs[0].as_i64().wrapping_neg()).cast(d),
        (Op::Binary(op), true) => {
            let src_d = u.src()[0].dtype();
            let (a, b) = (cs[0].as_f64(), cs[1].as_f64());
            let f32op = |x: f32, y: f32| -> f64 {
                (match op {
                    BinaryOp::Add => x + y,
                    BinaryOp::Sub => x - y,
                    BinaryOp::Mul => x * y,
                    _ => f32::NAN,
                }) as f64
            };
            match op {
                BinaryOp::CmpLt => ConstValue::Bool(a < b),
                BinaryOp::CmpNe => ConstValue::Bool(a != b),
                BinaryOp::Max => ConstValue::float(if a > b { a } else { b }).cast(d),
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul if src_d == DType::F32 => {
                    ConstValue::float(f32op(a as f32, b as f32))
                }
                BinaryOp::Add => ConstValue::float(a + b),
                BinaryOp::Sub => ConstValue::float(a - b),
                BinaryOp::Mul => ConstValue::float(a * b),
                BinaryOp::IDiv | BinaryOp::Mod => return None,
            }
        }
        (Op::Binary(op), false) => {
            let (a, b) = (cs[0].as_i64(), cs[1].as_i64());
            let r = match op {
                BinaryOp::Add => a.wrapping_add(b),
                BinaryOp::Sub => a.wrapping_sub(b),
                BinaryOp::Mul => a.wrapping_mul(b),
                BinaryOp::Max => a.max(b),
                BinaryOp::CmpLt => return Some(UOp::new(Op::Const(ConstValue::Bool(a < b)), d, vec![])),
                BinaryOp::CmpNe => return Some(UOp::new(Op::Const(ConstValue::Bool(a != b)), d, vec![])),
                BinaryOp::IDiv => int_div(a, b),
                BinaryOp::Mod => int_mod(a, b),
            };
            if d == DType::Bool { ConstValue::Bool(r != 0) } else { ConstValue::Int(r).cast(d) }
        }
        _ => return None,
    };
    Some(UOp::new(Op::Const(val), d, vec![]))
}

/// The IR's integer division: truncating, `x / 0 == 0`, wrapping on `MIN / -1`.
pub fn int_div(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_div(b) }
}

/// The IR's remainder: sign of the dividend, `x % 0 == 0`.
pub fn int_mod(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_rem(b) }
}

fn is_neg_zero(v: f64) -> bool {
    v == 0.0 && v.is_sign_negative()
}

/// Whether `u` has the number of sources its op needs (malformed input is left alone).
fn well_formed(u: &UOp) -> bool {
    let n = u.src().len();
    match u.op() {
        Op::Unary(_) | Op::Cast => n == 1,
        Op::Binary(_) => n == 2,
        Op::Where => n == 3,
        Op::Range { .. } => n == 1,
        _ => true,
    }
}

/// One rewrite step at `u` (whose sources are already simplified); `None` when nothing applies.
fn rewrite(u: &UOp, fold_divmod: bool) -> Option<UOp> {
    if !well_formed(u) || !u.src().iter().all(well_formed) {
        return None;
    }
    if let Some(c) = fold_const(u) {
        return Some(c);
    }
    let d = u.dtype();
    let src = u.src();
    // Integer expressions with provably one value become constants.
    if (d.is_int() || d == DType::Bool)
        && u.const_value().is_none()
        && (u.op().is_alu() || is_linear_op(u) || matches!(u.op(), Op::Range { .. }))
    {
        let (lo, hi) = u.bounds();
        if lo == hi && !matches!(u.op(), Op::Range { .. }) {
            return Some(if d == DType::Bool {
                UOp::new(Op::Const(ConstValue::Bool(lo != 0)), d, vec![])
            } else {
                konst(lo, d)
            });
        }
    }
    let cf = |k: usize| src.get(k).and_then(|s| s.const_value()).map(|c| c.as_f64());
    match u.op() {
        Op::Where if src[1] == src[2] => return Some(src[1].clone()),
        Op::Unary(UnaryOp::Neg) if matches!(src[0].op(), Op::Unary(UnaryOp::Neg)) => {
            return Some(src[0].src()[0].clone());
        }
        Op::Binary(BinaryOp::Mul) if d.is_float() => {
            if cf(1) == Some(1.0) {
                return Some(src[0].clone());
            }
            if cf(0) == Some(1.0) {
                return Some(src[1].clone());
            }
        }
        // x + (-0.0) == x and x - (+0.0) == x for every x; x + 0.0 is not (-0.0 + 0.0 == +0.0).
        Op::Binary(BinaryOp::Add) if d.is_float() => {
            if cf(1).is_some_and(is_neg_zero) {
                return Some(src[0].clone());
            }
            if cf(0).is_some_and(is_neg_zero) {
                return Some(src[1].clone());
            }
        }
        Op::Binary(BinaryOp::Sub) if d.is_float() && cf(1).is_some_and(|v| v == 0.0 && !is_neg_zero(v)) => {
            return Some(src[0].clone());
        }
        Op::Binary(BinaryOp::Max) if d.is_int() => {
            let (a, b) = (src[0].bounds(), src[1].bounds());
            if a.0 >= b.1 {
                return Some(src[0].clone());
            }
            if b.0 >= a.1 {
                return Some(src[1].clone());
            }
        }
        _ => {}
    }
    if !d.is_int() {
        return None;
    }
    if is_linear_op(u) {
        let lin = Linear::of(u)?;
        let rebuilt = lin.build(d);
        return if rebuilt == *u { None } else { Some(rebuilt) };
    }
    if !fold_divmod {
        return None;
    }
    let divisor = src.get(1).and_then(|s| s.const_int());
    match (u.op(), divisor) {
        (Op::Binary(BinaryOp::IDiv), Some(1)) => Some(src[0].clone()),
        (Op::Binary(BinaryOp::Mod), Some(1)) => Some(konst(0, d)),
        (Op::Binary(BinaryOp::IDiv), Some(c)) if c > 1 && src[0].vmin() >= 0 => {
            let x = &src[0];
            // (x // a) // c == x // (a*c) for x >= 0, a, c > 0
            if let (Op::Binary(BinaryOp::IDiv), Some(a)) =
                (x.op(), x.src().get(1).and_then(|s| s.const_int()))
                && a > 0
                && x.src()[0].vmin() >= 0
            {
                return Some(x.src()[0].binary(BinaryOp::IDiv, konst(a.checked_mul(c)?, d)));
            }
            let lin = Linear::of(x)?;
            let (mut quot, mut rem) = (Linear::default(), Linear::default());
            for (t, k) in &lin.terms {
                if k % c == 0 {
                    quot.terms.push((t.clone(), k / c));
                } else {
                    rem.terms.push((t.clone(), *k));
                }
            }
            quot.constant = lin.constant.div_euclid(c);
            rem.constant = lin.constant.rem_euclid(c);
            let (rlo, rhi) = rem.bounds();
            if rlo >= 0 && rlo / c == rhi / c {
                quot.constant += rlo / c;
                return Some(quot.build(d));
            }
            if !quot.terms.is_empty() && rlo >= 0 {
                let q = quot.build(d);
                return Some(q.binary(BinaryOp::Add, rem.build(d).binary(BinaryOp::IDiv, konst(c, d))));
            }
            None
        }
        (Op::Binary(BinaryOp::Mod), Some(c)) if c > 1 && src[0].vmin() >= 0 => {
            let x = &src[0];
            let (lo, hi) = x.bounds();
            if lo >= 0 && hi < c {
                return Some(x.clone());
            }
            let lin = Linear::of(x)?;
            let mut rem = Linear::default();
            for (t, k) in &lin.terms {
                if k % c != 0 {
                    rem.terms.push((t.clone(), *k));
                }
            }
            rem.constant = lin.constant.rem_euclid(c);
            let (rlo, rhi) = rem.bounds();
            if rlo >= 0 && rhi < c {
                return Some(rem.build(d));
            }
            if rlo >= 0 && (rem.terms.len() < lin.terms.len() || rem.constant != lin.constant) {
                return Some(rem.build(d).binary(BinaryOp::Mod, konst(c, d)));
            }
            None
        }
        (Op::Binary(BinaryOp::IDiv), _) if src[0].vmin() >= 0 && src[0].vmax() < src[1].vmin() => {
            Some(konst(0, d))
        }
        (Op::Binary(BinaryOp::Mod), _) if src[0].vmin() >= 0 && src[0].vmax() < src[1].vmin() => {
            Some(src[0].clone())
        }
        _ => None,
    }
}

/// Options of [`simplify_with`].
#[derive(Clone, Copy, Debug)]
pub struct SimplifyOptions {
    /// Fold IDIV and MOD using bounds. Turning this off exists only to reproduce the
    /// O(N^3) accumulator-placement bug in tests.
    pub fold_divmod: bool,
}

impl Default for SimplifyOptions {
    fn default() -> Self {
        SimplifyOptions { fold_divmod: true }
    }
}

/// Simplifies `u` to a fixed point (bottom-up, explicit stack).
pub fn simplify(u: &UOp) -> UOp {
    simplify_with(u, SimplifyOptions::default())
}

/// [`simplify`] with options.
pub fn simplify_with(u: &UOp, opts: SimplifyOptions) -> UOp {
    let mut memo: HashMap<UOp, UOp> = HashMap::new();
    simplify_memo(u, opts, &mut memo)
}

/// [`simplify_with`] sharing a memo across calls (for simplifying many roots of one graph).
pub fn simplify_memo(u: &UOp, opts: SimplifyOptions, memo: &mut HashMap<UOp, UOp>) -> UOp {
    let mut stack = vec![(u.clone(), false)];
    while let Some((x, ready)) = stack.pop() {
        if memo.contains_key(&x) {
            continue;
        }
        if !ready {
            stack.push((x.clone(), true));
            // Sources pushed last to first, so they are rebuilt first to last: new nodes are
            // created in source order, which the linearizer uses to break ties.
            for s in x.src().iter().rev() {
                if !memo.contains_key(s) {
                    stack.push((s.clone(), false));
                }
            }
            continue;
        }
        let new_src: Vec<UOp> = x.src().iter().map(|s| memo[s].clone()).collect();
        let mut cur = x.with_src(new_src);
        // Rewrites only ever produce nodes whose sources are simplified; a few rounds reach
        // a fixed point, and new sub-nodes built by a rule are simplified recursively.
        for _ in 0..16 {
            match rewrite(&cur, opts.fold_divmod) {
                Some(next) if next != cur => {
                    cur = if next.src().iter().all(|s| memo.get(s) == Some(s) || s.src().is_empty()) {
                        next
                    } else {
                        // New sub-nodes built by a rule; everything below them is already in
                        // the memo (results are recorded as fixed points), so this is shallow.
                        let srcs: Vec<UOp> =
                            next.src().iter().map(|s| simplify_memo(s, opts, memo)).collect();
                        next.with_src(srcs)
                    };
                }
                _ => break,
            }
        }
        // A result is its own simplification: later walks stop at it.
        memo.entry(cur.clone()).or_insert_with(|| cur.clone());
        memo.insert(x, cur);
    }
    memo[u].clone()
}

/// Writes `expr` as `coeff * var + rest` where `rest` does not mention `var`, if it is linear in
/// `var`. Used to prove that THREAD iterations touch disjoint memory.
pub fn split_linear(expr: &UOp, var: &UOp) -> Option<(i64, UOp)> {
    let lin = Linear::of(expr)?;
    let mut coeff = 0;
    let mut rest = Linear { terms: Vec::new(), constant: lin.constant };
    for (t, c) in &lin.terms {
        if t == var {
            coeff += c;
        } else if t.ranges_mentioned().contains(var) {
            return None;
        } else {
            rest.terms.push((t.clone(), *c));
        }
    }
    Some((coeff, rest.build(expr.dtype())))
}
