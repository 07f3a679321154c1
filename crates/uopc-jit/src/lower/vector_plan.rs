//! The analysis half of loop vectorization ([`super::vector`]): whether an innermost loop's
//! body vectorizes, and what it proved about the body's reductions, memory accesses, index
//! arithmetic and compares of the loop variable.

use super::*;
use std::collections::HashSet;
use uopc_ir::simplify;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reduction {
    Sum,
    Max,
}

/// How a memory access moves with the loop variable: `index = stride * r + rest`.
pub(super) struct Access {
    pub(super) stride: i64,
    pub(super) rest: UOp,
}

/// What the analysis proved about a loop body.
pub(super) struct VectorPlan {
    pub(super) accs: Vec<(Variable, Reduction)>,
    pub(super) access: HashMap<UOp, Access>,
    /// Integer index arithmetic: folded into addresses, never emitted as values.
    pub(super) index_math: HashSet<UOp>,
    /// Compares of the loop variable with a loop-invariant integer (see [`LaneCompare`]).
    pub(super) lane_compares: HashMap<UOp, LaneCompare>,
    /// Casts to f32 of an integer `stride * r + rest` (see [`LaneCast`]).
    pub(super) lane_casts: HashMap<UOp, LaneCast>,
}

/// A CAST to f32 of integer `stride * r + rest`, `r` the loop variable and `rest` computed
/// before the loop, every value within `±2^24` (exact in f32 and in i32 lanes): lane `k` of a
/// step from `first` is `stride * (first + k) + rest`, one vector add and conversion.
pub(super) struct LaneCast {
    pub(super) stride: i64,
    pub(super) rest: UOp,
}

/// Integers a [`LaneCast`] converts stay within this magnitude (f32's exact integers).
const LANE_CAST_LIMIT: i64 = 1 << 24;

/// `r != x`, `r < x` or `x < r` with `r` the loop variable and `x` computed before the loop (a
/// one-hot's `column == target`): lane `k` of a step from `first` compares `k` with
/// `x - first`, one vector integer compare.
pub(super) struct LaneCompare {
    pub(super) op: BinaryOp,
    pub(super) other: UOp,
    /// Whether the loop variable is the left operand.
    pub(super) range_left: bool,
}

impl Lowerer<'_, '_> {
    /// The register reductions of a loop body's `nodes` (with their `users`), when each
    /// register has exactly one load and one store, the load used only by the update (an f32
    /// sum or maximum); `None` when some register is used otherwise.
    fn register_reductions(
        &self,
        nodes: &[&UOp],
        users: &HashMap<&UOp, Vec<&UOp>>,
    ) -> Option<Vec<(Variable, Reduction)>> {
        let mut accs: Vec<(Variable, Reduction)> = Vec::new();
        let mut reg_uses: HashMap<u32, usize> = HashMap::new();
        for u in nodes {
            if let Some(index) = u.memory_index()
                && let Some(var) = self.register_of(index)
            {
                *reg_uses.entry(var.as_u32()).or_default() += 1;
                if let Some(store) = u.as_store() {
                    let v = store.value;
                    let red = match v.op() {
                        Op::Binary(BinaryOp::Add) => Reduction::Sum,
                        Op::Binary(BinaryOp::Max) => Reduction::Max,
                        _ => return None,
                    };
                    let load = v.src().iter().find(|x| x.as_load() == Some(index))?;
                    if v.dtype() != DType::F32 || users.get(load).map(Vec::len) != Some(1) {
                        return None;
                    }
                    accs.push((var, red));
                }
            }
        }
        let each_twice = accs.iter().all(|(v, _)| reg_uses.get(&v.as_u32()) == Some(&2));
        (each_twice && reg_uses.len() == accs.len()).then_some(accs)
    }

    /// Decides whether `body` (the body of innermost loop `range`) vectorizes, and how.
    pub(super) fn vector_plan(&self, range: &UOp, body: &[Stmt]) -> Option<VectorPlan> {
        let nodes: Vec<&UOp> =
            body.iter().map(|s| if let Stmt::Op(u) = s { Some(u) } else { None }).collect::<Option<_>>()?;
        let in_body: HashSet<&UOp> = nodes.iter().copied().collect();
        let mut users: HashMap<&UOp, Vec<&UOp>> = HashMap::new();
        for u in &nodes {
            for s in u.src() {
                users.entry(s).or_default().push(u);
            }
        }
        let accs = self.register_reductions(&nodes, &users)?;
        // Integer and bool nodes may only feed addresses (integers) or WHERE (float compares,
        // compares of the loop variable, and their negations).
        let mut index_math: HashSet<UOp> = HashSet::new();
        let mut lane_compares: HashMap<UOp, LaneCompare> = HashMap::new();
        let mut lane_casts: HashMap<UOp, LaneCast> = HashMap::new();
        for u in nodes.iter().rev() {
            if matches!(u.op(), Op::Index | Op::After | Op::End | Op::Sink | Op::Load | Op::Store) {
                continue;
            }
            let used_by = users.get(u).cloned().unwrap_or_default();
            match u.dtype() {
                d if d.is_int() => {
                    // Addresses, lane compares and lane casts take their integers whole.
                    let only_addresses = used_by.iter().all(|w| {
                        w.as_index().is_some_and(|i| i.offset == *u)
                            || index_math.contains(*w)
                            || lane_compares.contains_key(*w)
                            || lane_casts.contains_key(*w)
                    });
                    if !only_addresses || !u.op().is_alu() {
                        return None;
                    }
                    index_math.insert((*u).clone());
                }
                DType::Bool => {
                    let float_compare = u.as_binary().is_some_and(|(op, a, _)| {
                        matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) && a.dtype() == DType::F32
                    });
                    let lane_compare = self.lane_compare(u, range, &in_body);
                    // `c ? false : true` (a NOT) or `c ? true : false` of a mask
                    let negation = u.as_where().is_some_and(|w| {
                        let b = |x: &UOp| x.const_value().map(|c| c.as_f64() != 0.0);
                        matches!((b(w.then), b(w.otherwise)), (Some(t), Some(o)) if t != o)
                    });
                    let conds_only = used_by.iter().all(|w| w.as_where().is_some_and(|w| w.cond == *u));
                    if !(float_compare || lane_compare.is_some() || negation) || !conds_only {
                        return None;
                    }
                    if let Some(lc) = lane_compare {
                        lane_compares.insert((*u).clone(), lc);
                    }
                }
                DType::F32 => match u.op() {
                    Op::Binary(_) | Op::Where => {}
                    // Widening a 16-bit value: its f32 is the value already.
                    Op::Cast if u.as_cast().is_some_and(|x| x.dtype().is_half()) => {}
                    Op::Cast if let Some(lc) = self.lane_cast(u, range, &in_body) => {
                        lane_casts.insert((*u).clone(), lc);
                    }
                    Op::Unary(UnaryOp::Log2) | Op::Cast => return None,
                    Op::Unary(_) => {}
                    _ => return None,
                },
                // Rounding f32 (or other 16-bit) lanes to 16 bits: lane-wise integer and float ops.
                d if d.is_half()
                    && matches!(u.op(), Op::Cast)
                    && u.as_cast().is_some_and(|x| x.dtype() == DType::F32 || x.dtype().is_half()) => {}
                _ => return None,
            }
        }
        // Memory: f32, bf16 or f16, affine in the loop variable, invariant parts computable
        // outside.
        let mut access: HashMap<UOp, Access> = HashMap::new();
        let mut per_base: HashMap<UOp, Vec<(i64, UOp, bool)>> = HashMap::new();
        for u in &nodes {
            let Some(index) = u.memory_index() else { continue };
            if self.register_of(index).is_some() {
                continue;
            }
            let addressed = index.as_index()?;
            let base = view_base(addressed.base)?;
            if base.dtype() != DType::F32 && !base.dtype().is_half() {
                return None;
            }
            let (stride, rest) = split_linear(addressed.offset, range)?;
            if !self.index_expr_available(&rest, &in_body) {
                return None;
            }
            let is_store = matches!(u.op(), Op::Store);
            // A constant stored counting down (a row's suffix filled from its end) is the same
            // in every lane, so one vector store at the lowest of the four elements writes it.
            let constant = u.as_store().is_some_and(|st| st.value.const_value().is_some());
            if is_store && stride != 1 && !(stride == -1 && constant) {
                return None;
            }
            per_base.entry(base.clone()).or_default().push((stride, rest.clone(), is_store));
            access.insert(index.clone(), Access { stride, rest });
        }
        // A buffer stored in the loop may only be accessed at the iteration's own element, or
        // in a provably disjoint stretch: no value flows from one iteration to another
        // through memory.
        // The most trips the loop can run (its end's upper bound: a constant, or what the
        // variables' bounds allow).
        let trips = range.as_range()?.end.vmax();
        for list in per_base.values() {
            if !list.iter().any(|(_, _, st)| *st) {
                continue;
            }
            for (a, (sa, ra, _)) in list.iter().enumerate() {
                for (sb, rb, _) in &list[a + 1..] {
                    if (sa, ra) == (sb, rb) {
                        continue;
                    }
                    let gap = simplify(&(ra - rb)).const_int()?;
                    if *sa != 1 || *sb != 1 || gap.abs() < trips {
                        return None;
                    }
                }
            }
        }
        Some(VectorPlan { accs, access, index_math, lane_compares, lane_casts })
    }

    /// `u` as a [`LaneCast`] over the loop variable `range`.
    fn lane_cast(&self, u: &UOp, range: &UOp, in_body: &HashSet<&UOp>) -> Option<LaneCast> {
        let x = u.as_cast()?;
        if !x.dtype().is_int() || u.dtype() != DType::F32 {
            return None;
        }
        let (lo, hi) = x.bounds();
        if lo <= -LANE_CAST_LIMIT || hi >= LANE_CAST_LIMIT {
            return None;
        }
        let (stride, rest) = split_linear(x, range)?;
        let small = stride.abs() < LANE_CAST_LIMIT / 4;
        (small && self.index_expr_available(&rest, in_body) && !mentions(&rest, range))
            .then_some(LaneCast { stride, rest })
    }

    /// `u` as a compare of the loop variable `range` with an integer already computed before
    /// the loop (a constant, an enclosing range or an earlier value).
    fn lane_compare(&self, u: &UOp, range: &UOp, in_body: &HashSet<&UOp>) -> Option<LaneCompare> {
        let (op, a, b) = u.as_binary()?;
        if !matches!(op, BinaryOp::CmpLt | BinaryOp::CmpNe) || !a.dtype().is_int() {
            return None;
        }
        // One side is `r + rest` (the loop variable at stride 1), the other free of it:
        // `r + rest < x` is `r < x - rest`.
        let moving = |e: &UOp| split_linear(e, range).filter(|(s, _)| *s == 1).map(|(_, rest)| rest);
        let (range_left, rest, other) = if !mentions(b, range) {
            (true, moving(a)?, b)
        } else if !mentions(a, range) {
            (false, moving(b)?, a)
        } else {
            return None;
        };
        let other = if rest.const_int() == Some(0) { other.clone() } else { simplify(&(other - &rest)) };
        let available = !mentions(&other, range) && self.index_expr_available(&other, in_body);
        available.then_some(LaneCompare { op, other, range_left })
    }

    /// Whether `e` can be computed before the loop: constants, enclosing ranges, values
    /// already computed, and integer arithmetic on those.
    fn index_expr_available(&self, e: &UOp, in_body: &HashSet<&UOp>) -> bool {
        let computed = e.const_value().is_some()
            || self.range_vars.contains_key(e)
            || self.var_vals.contains_key(e)
            || (self.vals.contains_key(e) && !in_body.contains(e));
        // A value computed already (a load before the loop) is not entered.
        computed
            || (e.op().is_alu()
                && e.dtype().is_int()
                && e.src().iter().all(|x| self.index_expr_available(x, in_body)))
    }
}

/// Whether `e` reads `var`.
fn mentions(e: &UOp, var: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(e)).contains(var)
}
