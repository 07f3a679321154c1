//! Loop vectorization: an innermost counted loop whose body is f32 math over contiguous (or
//! loop-invariant) memory runs four iterations per step in F32X4 values, the only vector width
//! Cranelift lowers on x86-64. A constant may also be stored counting down (stride -1).
//! Register reductions (`acc = acc + x`, `acc = max(acc, x)`) keep vector partial results,
//! reduced across lanes after the loop; a scalar loop runs the tail. Integers that move with
//! the loop variable enter the lanes in two forms: a compare of `r + rest` with a loop-invariant
//! integer (an I32X4 compare of the lane numbers) and a cast to f32 of `stride * r + rest`
//! (I32X4 lanes, one conversion). Anything else (other integer or f64 math on the loop
//! variable, calls, strided stores, memory carried from one iteration to the next) keeps the
//! scalar lowering.

use super::vector_plan::{LaneCompare, Reduction, VectorPlan};
use super::*;
use cranelift_codegen::ir::Endianness;

/// Lanes of an F32X4.
const LANES: i64 = 4;

/// What every statement of one vector copy of a loop body shares.
struct VectorStep<'p> {
    plan: &'p VectorPlan,
    /// The copy's partial result of each planned accumulator, in plan order.
    partials: &'p [Variable],
    /// The loop index of lane 0.
    first: Value,
    /// Each access's loop-invariant element index and immediate offset.
    rest_vals: &'p HashMap<UOp, (Value, i32)>,
    /// Per lane compare, the loop-invariant operand clamped and splat as I32X4, and the lane
    /// numbers, computed before the loop (see [`Lowerer::hoisted_lane_operands`]); empty where
    /// the loop's indices do not fit in i32.
    lane_operands: &'p HashMap<UOp, (Value, Value)>,
    /// Per lane compare, its loop-invariant operand; per lane cast, its loop-invariant `rest`
    /// (both i64, computed before the loop).
    invariants: &'p HashMap<UOp, Value>,
}

impl VectorStep<'_> {
    /// The partial result standing for accumulator `var` in this copy.
    fn partial_of(&self, var: Variable) -> Variable {
        let k = self.plan.accs.iter().position(|(a, _)| *a == var).expect("accumulator is planned");
        self.partials[k]
    }
}

/// A value in the vector body: one f32 for all lanes, or four.
#[derive(Clone, Copy)]
enum Lanes {
    Uniform(Value),
    Vector(Value),
}

/// The integer condition of lane compare `lc` with the loop's index on the left: `i != x`,
/// `i < x`, or (the index on the right) `x < i`, which is `i > x`.
fn lane_condition(lc: &LaneCompare) -> IntCC {
    match (lc.op, lc.range_left) {
        (BinaryOp::CmpNe, _) => IntCC::NotEqual,
        (_, true) => IntCC::SignedLessThan,
        (_, false) => IntCC::SignedGreaterThan,
    }
}

fn vec_flags() -> MemFlagsData {
    // In bounds but not necessarily 16-byte aligned.
    MemFlagsData::new().with_notrap()
}

fn lane_bitcast() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

impl Lowerer<'_, '_> {
    /// Lowers `range` vectorized if its body allows it; `Ok(false)` leaves it to the caller.
    pub(super) fn try_vectorize(
        &mut self,
        range: &UOp,
        body: &[Stmt],
        trips: Trips,
    ) -> Result<bool, JitError> {
        let Some(plan) = self.vector_plan(range, body) else { return Ok(false) };
        // Copies hide the latency of the accumulator chains; an exp2 body is long enough to
        // hide it with two, and four would spill its polynomial constants and accumulators.
        let has_exp2 =
            body.iter().any(|s| matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Unary(UnaryOp::Exp2))));
        let copies: i64 = match plan.accs.len() {
            0 => 2,
            1 | 2 if has_exp2 => 2,
            1 | 2 => 4,
            3 | 4 => 2,
            _ => 1,
        };
        let copies = (1..=copies).rev().find(|c| trips.max() >= c * LANES).unwrap_or(0);
        if copies == 0 {
            return Ok(false);
        }
        let step = copies * LANES;

        // Loop-invariant parts of every address, computed once before the loop.
        let mut inserted = Vec::new();
        // A constant term of an address becomes the access's immediate offset, so accesses
        // that differ by constants share one pointer.
        let mut rest_vals: HashMap<UOp, (Value, i32)> = HashMap::new();
        // Accesses whose variable parts are the same expression share its value: each would
        // otherwise be its own register (at `opt_level=none` even a constant), live across
        // the loop.
        let mut rest_of_expr: HashMap<UOp, Value> = HashMap::new();
        // In body order, so the code emitted does not depend on hash order.
        let indices = body.iter().filter_map(|s| match s {
            Stmt::Op(u) => u.memory_index(),
            _ => None,
        });
        for index in indices {
            let Some(a) = plan.access.get(index).filter(|_| !rest_vals.contains_key(index)) else {
                continue;
            };
            let split = split_constant_term(&a.rest, index.dtype().size() as i64);
            let (x, offset) = split.unwrap_or((a.rest.clone(), 0));
            let v = match rest_of_expr.get(&x) {
                Some(v) => *v,
                None => {
                    let v = self.emit_index_expr(&x, &mut inserted)?;
                    rest_of_expr.insert(x, v);
                    v
                }
            };
            rest_vals.insert(index.clone(), (v, offset));
        }
        // The loop-invariant integers of lane compares and lane casts, in a fixed order.
        let mut invariants: HashMap<UOp, Value> = HashMap::new();
        let mut lane_nodes: Vec<(&UOp, &UOp)> =
            plan.lane_compares.iter().map(|(u, lc)| (u, &lc.other)).collect();
        lane_nodes.extend(plan.lane_casts.iter().map(|(u, lc)| (u, &lc.rest)));
        lane_nodes.sort_by_key(|(u, _)| u.id());
        for (u, e) in lane_nodes {
            let v = self.emit_index_expr(e, &mut inserted)?;
            let v = self.as_i64(v);
            invariants.insert(u.clone(), v);
        }
        let lane_operands = self.hoisted_lane_operands(&plan, trips.max() + step, &invariants);
        // Vector partial results: lane 0 of copy 0 carries the incoming value of a sum; a
        // max starts every lane at the incoming value.
        let mut partials: Vec<Vec<Variable>> = Vec::new();
        for k in 0..copies {
            let mut row = Vec::new();
            for &(acc, red) in &plan.accs {
                let var = self.b.declare_var(types::F32X4);
                let current = self.b.use_var(acc);
                let init = match (red, k) {
                    (Reduction::Max, _) => self.b.ins().splat(types::F32X4, current),
                    (Reduction::Sum, 0) => {
                        let zero = self.b.ins().f32const(0.0);
                        let z = self.b.ins().splat(types::F32X4, zero);
                        self.b.ins().insertlane(z, current, 0)
                    }
                    (Reduction::Sum, _) => {
                        let zero = self.b.ins().f32const(0.0);
                        self.b.ins().splat(types::F32X4, zero)
                    }
                };
                self.b.def_var(var, init);
                row.push(var);
            }
            partials.push(row);
        }

        let zero = self.b.ins().iconst(types::I64, 0);
        let main = self.main_end(trips, step);
        let end = self.main_end_value(main);
        self.counted_loop(LoopTest::Bottom, zero, end, step, |l, iv| {
            for (k, row) in partials.iter().enumerate() {
                let base = l.b.use_var(iv);
                let first = l.b.ins().iadd_imm_s(base, k as i64 * LANES);
                let at = VectorStep {
                    plan: &plan,
                    partials: row,
                    first,
                    rest_vals: &rest_vals,
                    lane_operands: &lane_operands,
                    invariants: &invariants,
                };
                l.vector_body(body, &at)?;
            }
            Ok(())
        })?;

        // Combine copies, then lanes, into the scalar accumulators.
        for (a, &(acc, red)) in plan.accs.iter().enumerate() {
            let mut v = self.b.use_var(partials[0][a]);
            for row in &partials[1..] {
                let w = self.b.use_var(row[a]);
                v = self.combine(red, v, w);
            }
            let mut s = self.b.ins().extractlane(v, 0);
            for lane in 1..LANES as u8 {
                let x = self.b.ins().extractlane(v, lane);
                s = self.combine(red, s, x);
            }
            self.b.def_var(acc, s);
        }
        for key in inserted {
            self.vals.remove(&key);
        }
        self.tail(range, body, main, trips)?;
        Ok(true)
    }

    fn combine(&mut self, red: Reduction, a: Value, b: Value) -> Value {
        match red {
            Reduction::Sum => self.b.ins().fadd(a, b),
            Reduction::Max => self.fmax(a, b),
        }
    }

    /// `cmp(a, b) ? x : y` for f32 scalars or F32X4 lanes (one `maxps`-style select).
    pub(super) fn fselect(&mut self, cc: FloatCC, a: Value, b: Value, x: Value, y: Value) -> Value {
        let c = self.b.ins().fcmp(cc, a, b);
        if self.b.func.dfg.value_type(x).is_vector() {
            let mask = self.b.ins().bitcast(types::F32X4, lane_bitcast(), c);
            self.b.ins().bitselect(mask, x, y)
        } else {
            self.b.ins().select(c, x, y)
        }
    }

    /// For each lane compare of `plan`, its loop-invariant operand `x` clamped to
    /// `[-1, bound]` and splat as I32X4, and the lane numbers `0..4`, emitted before the loop
    /// so that each vector step compares `first + k` with it directly. Every index the loop
    /// takes lies in `0..bound`, where the clamped `x` compares as `x` does (below, equal or
    /// above each index alike). Empty when `bound` does not fit in i32: [`Lowerer::lane_mask`]
    /// then clamps per step.
    fn hoisted_lane_operands(
        &mut self,
        plan: &VectorPlan,
        bound: i64,
        invariants: &HashMap<UOp, Value>,
    ) -> HashMap<UOp, (Value, Value)> {
        let mut out = HashMap::new();
        if bound >= i64::from(i32::MAX) {
            return out;
        }
        // In a fixed order, so the code emitted does not depend on hash order.
        let mut compares: Vec<&UOp> = plan.lane_compares.keys().collect();
        compares.sort_by_key(|u| u.id());
        for u in compares {
            let xs = self.clamped_lanes(invariants[u], bound);
            let k = self.lane_numbers();
            out.insert(u.clone(), (xs, k));
        }
        out
    }

    /// Integer value `x` widened to i64.
    fn as_i64(&mut self, x: Value) -> Value {
        if self.b.func.dfg.value_type(x) == types::I64 { x } else { self.b.ins().sextend(types::I64, x) }
    }

    /// i64 `x` clamped to `[-1, hi]`, narrowed to i32 and splat over I32X4: compared with
    /// values in `0..hi` it compares as `x` does, and it fits the lanes.
    fn clamped_lanes(&mut self, x: Value, hi: i64) -> Value {
        let (lo, hi) = (self.b.ins().iconst(types::I64, -1), self.b.ins().iconst(types::I64, hi));
        let x = self.b.ins().smax(x, lo);
        let x = self.b.ins().smin(x, hi);
        let x = self.b.ins().ireduce(types::I32, x);
        self.b.ins().splat(types::I32X4, x)
    }

    /// The lane numbers `0 .. LANES` as an I32X4 constant.
    fn lane_numbers(&mut self) -> Value {
        let lanes: Vec<u8> = (0..LANES as i32).flat_map(|k| k.to_le_bytes()).collect();
        let c = self.b.func.dfg.constants.insert(lanes.into());
        self.b.ins().vconst(types::I32X4, c)
    }

    /// The I32X4 mask of lane compare `u` for the four iterations from `first`: with the
    /// operand hoisted ([`Lowerer::hoisted_lane_operands`]), `first + k` against it; otherwise
    /// the difference `x - first`, clamped to `[-1, 4]` (every lane compares alike beyond),
    /// against the lane numbers.
    fn lane_mask_of(&mut self, u: &UOp, at: &VectorStep<'_>) -> Result<Value, JitError> {
        let lc = &at.plan.lane_compares[u];
        let Some(&(xs, k)) = at.lane_operands.get(u) else {
            return Ok(self.lane_mask(lc, at.invariants[u], at.first));
        };
        let first = self.b.ins().ireduce(types::I32, at.first);
        let first = self.b.ins().splat(types::I32X4, first);
        let lanes = self.b.ins().iadd(first, k);
        // lane k stands for iteration first + k
        Ok(self.b.ins().icmp(lane_condition(lc), lanes, xs))
    }

    /// The I32X4 mask of a [`LaneCompare`] for the four iterations from `first`: the
    /// difference `x - first`, clamped to `[-1, 4]` (every lane compares alike beyond), against
    /// the lane numbers.
    fn lane_mask(&mut self, lc: &LaneCompare, x: Value, first: Value) -> Value {
        let d = self.b.ins().isub(x, first);
        let d = self.clamped_lanes(d, LANES);
        let k = self.lane_numbers();
        // lane k stands for iteration first + k: `first + k != x` is `k != d`, `first + k < x`
        // is `k < d`, `x < first + k` is `k > d`
        self.b.ins().icmp(lane_condition(lc), k, d)
    }

    /// The F32X4 lanes of lane cast `u` for the four iterations from `first`:
    /// `stride * (first + k) + rest` in i32 lanes, converted.
    fn lane_cast_of(&mut self, u: &UOp, at: &VectorStep<'_>) -> Value {
        let stride = at.plan.lane_casts[u].stride;
        let base = self.b.ins().imul_imm_s(at.first, stride);
        let base = self.b.ins().iadd(base, at.invariants[u]);
        let base = self.b.ins().ireduce(types::I32, base);
        let base = self.b.ins().splat(types::I32X4, base);
        let steps: Vec<u8> = (0..LANES).flat_map(|k| ((k * stride) as i32).to_le_bytes()).collect();
        let c = self.b.func.dfg.constants.insert(steps.into());
        let steps = self.b.ins().vconst(types::I32X4, c);
        let lanes = self.b.ins().iadd(base, steps);
        self.b.ins().fcvt_from_sint(types::F32X4, lanes)
    }

    /// Emits integer expression `e` at the current point; nodes it adds to `vals` are
    /// recorded so the caller can forget them (they are only valid where emitted).
    fn emit_index_expr(&mut self, e: &UOp, inserted: &mut Vec<UOp>) -> Result<Value, JitError> {
        let computed = e.const_value().is_some()
            || self.range_vars.contains_key(e)
            || self.var_vals.contains_key(e)
            || self.vals.contains_key(e);
        if !computed {
            // Sources first; a value computed already (a load before the loop) is not entered.
            for x in e.src() {
                self.emit_index_expr(x, inserted)?;
            }
            self.stmt(e)?;
            inserted.push(e.clone());
        }
        self.val(e)
    }

    fn lanes_of(&mut self, vals: &HashMap<UOp, Lanes>, u: &UOp) -> Result<Lanes, JitError> {
        match vals.get(u) {
            Some(l) => Ok(*l),
            None => Ok(Lanes::Uniform(self.val(u)?)),
        }
    }

    fn vector(&mut self, l: Lanes) -> Value {
        match l {
            Lanes::Vector(v) => v,
            Lanes::Uniform(s) => self.b.ins().splat(types::F32X4, s),
        }
    }

    /// One F32X4 copy of the loop body for iterations `first .. first + 4`.
    fn vector_body(&mut self, body: &[Stmt], at: &VectorStep<'_>) -> Result<(), JitError> {
        let plan = at.plan;
        let mut vals: HashMap<UOp, Lanes> = HashMap::new();
        // `rest + first` per distinct `rest`: accesses sharing their variable part share the
        // element index of lane 0 (one add, not one per access; `opt_level=none` merges nothing).
        let mut lane0: HashMap<Value, Value> = HashMap::new();
        for s in body {
            let Stmt::Op(u) = s else { unreachable!("innermost loop") };
            if plan.index_math.contains(u) || matches!(u.op(), Op::Index | Op::After | Op::End | Op::Sink) {
                continue;
            }
            let out = match u.op() {
                Op::Load => self.vector_load(u, at, &mut lane0)?,
                Op::Store => {
                    self.vector_store(u, at, &vals, &mut lane0)?;
                    continue;
                }
                Op::Binary(_) if plan.lane_compares.contains_key(u) => {
                    Lanes::Vector(self.lane_mask_of(u, at)?)
                }
                // A negation of a mask (the plan admits only `c ? false : true` and its converse).
                Op::Where if u.dtype() == DType::Bool => {
                    let w = u.as_where().ok_or_else(|| malformed(u))?;
                    let keep = w.then.const_value().is_some_and(|c| c.as_f64() != 0.0);
                    match self.lanes_of(&vals, w.cond)? {
                        Lanes::Vector(m) => Lanes::Vector(if keep { m } else { self.b.ins().bnot(m) }),
                        Lanes::Uniform(c) => {
                            let (t, o) = (self.val(w.then)?, self.val(w.otherwise)?);
                            Lanes::Uniform(self.b.ins().select(c, t, o))
                        }
                    }
                }
                Op::Binary(BinaryOp::Mul) if self.contracted.contains(u) => continue,
                Op::Binary(BinaryOp::Add) if u.src().iter().any(|s| self.contracted.contains(s)) => {
                    let (_, x, y) = u.as_binary().ok_or_else(|| malformed(u))?;
                    let (m, other) = if self.contracted.contains(x) { (x, y) } else { (y, x) };
                    let (_, ma, mb) = m.as_binary().ok_or_else(|| malformed(m))?;
                    let ops = [ma, mb, other];
                    let lanes: Vec<Lanes> =
                        ops.iter().map(|x| self.lanes_of(&vals, x)).collect::<Result<_, _>>()?;
                    let [a, b, c] = self.unify(&lanes)[..] else { unreachable!("three operands") };
                    let r = self.b.ins().fma(a, b, c);
                    self.wrap(&lanes, r)
                }
                Op::Binary(op) => {
                    let (_, x, y) = u.as_binary().ok_or_else(|| malformed(u))?;
                    let lanes = [self.lanes_of(&vals, x)?, self.lanes_of(&vals, y)?];
                    let [a, b] = self.unify(&lanes)[..] else { unreachable!("two operands") };
                    let r = match op {
                        BinaryOp::Add => self.b.ins().fadd(a, b),
                        BinaryOp::Sub => self.b.ins().fsub(a, b),
                        BinaryOp::Mul => self.b.ins().fmul(a, b),
                        BinaryOp::Max => self.fmax(a, b),
                        BinaryOp::CmpLt => self.b.ins().fcmp(FloatCC::LessThan, a, b),
                        BinaryOp::CmpNe => self.b.ins().fcmp(FloatCC::NotEqual, a, b),
                        BinaryOp::IDiv | BinaryOp::Mod => {
                            return Err(JitError::Internal("integer op in a vector body".into()));
                        }
                    };
                    self.wrap(&lanes, r)
                }
                Op::Where => {
                    let w = u.as_where().ok_or_else(|| malformed(u))?;
                    let lanes = [
                        self.lanes_of(&vals, w.cond)?,
                        self.lanes_of(&vals, w.then)?,
                        self.lanes_of(&vals, w.otherwise)?,
                    ];
                    match lanes {
                        [Lanes::Uniform(c), ..] => {
                            let [a, b] = self.unify(&lanes[1..])[..] else { unreachable!("two branches") };
                            let r = self.b.ins().select(c, a, b);
                            self.wrap(&lanes[1..], r)
                        }
                        [Lanes::Vector(mask), x, y] => {
                            let (a, b) = (self.vector(x), self.vector(y));
                            let m = self.b.ins().bitcast(types::F32X4, lane_bitcast(), mask);
                            Lanes::Vector(self.b.ins().bitselect(m, a, b))
                        }
                    }
                }
                // The plan admits only casts from f32 or 16-bit values to f32 or 16-bit types:
                // widening is the value itself, narrowing rounds each lane.
                Op::Cast if u.dtype().is_half() => {
                    match self.lanes_of(&vals, u.as_cast().ok_or_else(|| malformed(u))?)? {
                        Lanes::Uniform(v) => Lanes::Uniform(self.half_round(u.dtype(), v)),
                        Lanes::Vector(v) => Lanes::Vector(self.half_round(u.dtype(), v)),
                    }
                }
                Op::Cast if plan.lane_casts.contains_key(u) => Lanes::Vector(self.lane_cast_of(u, at)),
                Op::Cast => self.lanes_of(&vals, u.as_cast().ok_or_else(|| malformed(u))?)?,
                Op::Unary(op) => {
                    let x = self.lanes_of(&vals, u.as_unary().ok_or_else(|| malformed(u))?.1)?;
                    let v = match x {
                        Lanes::Uniform(v) | Lanes::Vector(v) => v,
                    };
                    let r = match op {
                        UnaryOp::Neg => self.b.ins().fneg(v),
                        UnaryOp::Sqrt => self.b.ins().sqrt(v),
                        UnaryOp::Recip => {
                            let one = self.fconst(self.b.func.dfg.value_type(v), 1.0);
                            self.b.ins().fdiv(one, v)
                        }
                        UnaryOp::Exp2 => self.exp2_f32(v),
                        UnaryOp::Log2 => return Err(JitError::Internal("log2 in a vector body".into())),
                    };
                    self.wrap(&[x], r)
                }
                other => return Err(JitError::Internal(format!("{} in a vector body", other.name()))),
            };
            vals.insert(u.clone(), out);
        }
        Ok(())
    }

    /// A LOAD in the vector body: the register accumulator's partial result, or one f32 for
    /// all lanes (stride 0), one vector load (stride 1), or four scalar loads (a gather).
    fn vector_load(
        &mut self,
        u: &UOp,
        at: &VectorStep<'_>,
        lane0: &mut HashMap<Value, Value>,
    ) -> Result<Lanes, JitError> {
        let index = u.as_load().ok_or_else(|| malformed(u))?;
        let lanes = if let Some(var) = self.register_of(index) {
            let p = at.partial_of(var);
            Lanes::Vector(self.b.use_var(p))
        } else {
            let a = &at.plan.access[index];
            let base = self.base_address(index)?;
            let (rest, offset) = at.rest_vals[index];
            let d = index.dtype();
            match a.stride {
                0 if d.is_half() => {
                    let addr = self.sized_element_address(base, rest, d);
                    Lanes::Uniform(self.half_load(d, addr, offset))
                }
                0 => {
                    let addr = self.element_address(base, rest);
                    Lanes::Uniform(self.b.ins().load(types::F32, mem(), addr, offset))
                }
                1 if d.is_half() => {
                    let i = *lane0.entry(rest).or_insert_with(|| self.b.ins().iadd(rest, at.first));
                    let addr = self.sized_element_address(base, i, d);
                    Lanes::Vector(self.half_load_x4(d, vec_flags(), addr, offset))
                }
                1 => {
                    let i = *lane0.entry(rest).or_insert_with(|| self.b.ins().iadd(rest, at.first));
                    let addr = self.element_address(base, i);
                    Lanes::Vector(self.b.ins().load(types::F32X4, vec_flags(), addr, offset))
                }
                stride => {
                    // A strided gather: four scalar loads.
                    let mut v = None;
                    for lane in 0..LANES {
                        let t = self.b.ins().iadd_imm_s(at.first, lane);
                        let off = self.b.ins().imul_imm_s(t, stride);
                        let i = self.b.ins().iadd(rest, off);
                        let addr = self.sized_element_address(base, i, d);
                        let x = if d.is_half() {
                            self.half_load(d, addr, offset)
                        } else {
                            self.b.ins().load(types::F32, mem(), addr, offset)
                        };
                        v = Some(match v {
                            None => self.b.ins().splat(types::F32X4, x),
                            Some(w) => self.b.ins().insertlane(w, x, lane as u8),
                        });
                    }
                    Lanes::Vector(v.expect("four lanes"))
                }
            }
        };
        Ok(lanes)
    }

    /// A STORE in the vector body: to the accumulator's partial result, or one vector store.
    fn vector_store(
        &mut self,
        u: &UOp,
        at: &VectorStep<'_>,
        vals: &HashMap<UOp, Lanes>,
        lane0: &mut HashMap<Value, Value>,
    ) -> Result<(), JitError> {
        let store = u.as_store().ok_or_else(|| malformed(u))?;
        let index = store.index;
        let x = self.lanes_of(vals, store.value)?;
        let x = self.vector(x);
        if let Some(var) = self.register_of(index) {
            let p = at.partial_of(var);
            self.b.def_var(p, x);
        } else {
            let base = self.base_address(index)?;
            let (rest, offset) = at.rest_vals[index];
            let i = if at.plan.access[index].stride == -1 {
                // Lanes `k` write element `rest - first - k` (the plan allows this only for a
                // constant, equal in every lane): the vector starts at lane 3's.
                let top = self.b.ins().isub(rest, at.first);
                self.b.ins().iadd_imm_s(top, 1 - LANES)
            } else {
                *lane0.entry(rest).or_insert_with(|| self.b.ins().iadd(rest, at.first))
            };
            let d = index.dtype();
            let addr = self.sized_element_address(base, i, d);
            if d.is_half() {
                self.half_store_x4(d, vec_flags(), x, addr, offset);
            } else {
                self.b.ins().store(vec_flags(), x, addr, offset);
            }
        }
        Ok(())
    }

    /// `base + i * size`: the address of element `i` of a buffer of `d`.
    fn sized_element_address(&mut self, base: Value, i: Value, d: DType) -> Value {
        let off = self.scale_index(i, d.size() as i64);
        self.b.ins().iadd(base, off)
    }

    /// Operands as values of one type: all scalar, or all F32X4 (uniform ones splatted).
    fn unify(&mut self, lanes: &[Lanes]) -> Vec<Value> {
        let any_vector = lanes.iter().any(|l| matches!(l, Lanes::Vector(_)));
        lanes
            .iter()
            .map(|l| match (*l, any_vector) {
                (Lanes::Uniform(s), false) => s,
                (l, _) => self.vector(l),
            })
            .collect()
    }

    fn wrap(&self, operands: &[Lanes], r: Value) -> Lanes {
        if operands.iter().any(|l| matches!(l, Lanes::Vector(_))) {
            Lanes::Vector(r)
        } else {
            Lanes::Uniform(r)
        }
    }
}
