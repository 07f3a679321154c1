//! Register tiles in F32X4: superword-level packing of a reduce loop's accumulators.
//!
//! An upcast output axis makes the body of a reduce loop a set of copies, each updating its own
//! scalar accumulator: `acc_c = acc_c + x_c`. When four copies differ only in loads whose
//! indices are `i, i+1, i+2, i+3` (everything else shared), the four accumulators become one
//! F32X4 value, the four loads one vector load, and shared scalars a splat. This is the GEMM
//! micro-kernel shape (`C[i, j..j+4] += A[i, k] * B[k, j..j+4]`) that the vectorizer of
//! innermost loops cannot reach, because there the lanes are the loop's own iterations.

use super::*;
use std::collections::HashSet;
use uopc_ir::simplify_memo;

/// Lanes of an F32X4.
pub(super) const LANES: usize = 4;

/// One accumulator update `acc = acc + x` in the loop body.
struct Update {
    var: Variable,
    acc_load: UOp,
    add: UOp,
    store: UOp,
    x: UOp,
}

/// Four updates whose `x` trees differ only in contiguous loads.
struct Pack {
    /// Indices into the update list, lane order.
    lanes: [usize; LANES],
    vector: Variable,
}

fn is_mul(u: &UOp) -> bool {
    matches!(u.op(), Op::Binary(BinaryOp::Mul))
}

/// Float ops a packed tree may contain where its lanes differ.
pub(super) fn packable(u: &UOp) -> bool {
    u.dtype() == DType::F32
        && matches!(
            u.op(),
            Op::Load
                | Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max)
                | Op::Unary(UnaryOp::Neg | UnaryOp::Exp2 | UnaryOp::Sqrt | UnaryOp::Recip)
        )
}

impl Lowerer<'_, '_> {
    /// Lowers innermost loop `range` with packed accumulators if four or more of its
    /// accumulator updates pack; `Ok(false)` leaves the loop to the caller.
    pub(super) fn try_tile(&mut self, range: &UOp, body: &[Stmt]) -> Result<bool, JitError> {
        let Some(nodes) =
            body.iter().map(|s| if let Stmt::Op(u) = s { Some(u) } else { None }).collect::<Option<Vec<_>>>()
        else {
            return Ok(false);
        };
        // A store to memory in the body could be reordered against the packed loads.
        if nodes.iter().any(|u| {
            matches!(u.op(), Op::Tile(_)) || u.as_store().is_some_and(|s| self.register_of(s.index).is_none())
        }) {
            return Ok(false);
        }
        let updates = self.updates(&nodes);
        if updates.len() < LANES {
            return Ok(false);
        }
        let in_body: HashSet<&UOp> = nodes.iter().copied().collect();
        let registers: HashSet<&UOp> =
            self.storage.iter().filter(|(_, s)| matches!(s, Storage::Vars(_))).map(|(a, _)| a).collect();
        let lane_sets = find_packs(&updates, &|u| in_body.contains(u), &|a| !registers.contains(a));
        if lane_sets.is_empty() {
            return Ok(false);
        }

        let skipped = self.scalar_nodes_replaced(&nodes, &updates, &lane_sets);
        // Where each pack is emitted: at the last of its four stores.
        let mut emit_at: HashMap<UOp, usize> = HashMap::new();
        let mut packs = Vec::new();
        for (p, lanes) in lane_sets.iter().enumerate() {
            let last = lanes
                .iter()
                .map(|&k| &updates[k].store)
                .max_by_key(|s| nodes.iter().position(|u| u == s))
                .expect("four lanes");
            emit_at.insert(last.clone(), p);
            let vector = self.b.declare_var(types::F32X4);
            let init = self.vector_of_vars(lanes.map(|k| updates[k].var));
            self.b.def_var(vector, init);
            packs.push(Pack { lanes: *lanes, vector });
        }

        let emit = |l: &mut Self| -> Result<(), JitError> {
            let mut memo: HashMap<[UOp; LANES], Value> = HashMap::new();
            for u in &nodes {
                if let Some(&p) = emit_at.get(*u) {
                    let pack = &packs[p];
                    let xs = pack.lanes.map(|k| updates[k].x.clone());
                    let acc = l.b.use_var(pack.vector);
                    let next = l.packed_add(&xs, acc, &mut memo)?;
                    l.b.def_var(pack.vector, next);
                } else if !skipped.contains(*u) {
                    l.stmt(u)?;
                }
            }
            Ok(())
        };
        self.tile_loop(range, &emit)?;
        for pack in &packs {
            let v = self.b.use_var(pack.vector);
            let vars = pack.lanes.map(|k| updates[k].var);
            for (lane, &k) in pack.lanes.iter().enumerate() {
                let x = self.b.ins().extractlane(v, lane as u8);
                self.b.def_var(updates[k].var, x);
                self.tile_results.insert(updates[k].var.as_u32(), (v, lane, vars));
            }
        }
        Ok(true)
    }

    /// The body's nodes that packed code computes instead (the lanes' scalar math, and shared
    /// loads only splats use, which are recorded in `splat_loads` to be loaded at each splat).
    fn scalar_nodes_replaced(
        &mut self,
        nodes: &[&UOp],
        updates: &[Update],
        lane_sets: &[[usize; LANES]],
    ) -> HashSet<UOp> {
        // Nodes that only packed updates use are not emitted as scalars.
        let mut varying: HashSet<UOp> = HashSet::new();
        // Shared scalars a pack splats: emitted as scalars even where another pack varies in them.
        let mut keep: HashSet<UOp> = HashSet::new();
        for lanes in lane_sets {
            for &k in lanes {
                let up = &updates[k];
                varying.extend([up.acc_load.clone(), up.add.clone(), up.store.clone()]);
            }
            collect_varying(&lanes.map(|k| updates[k].x.clone()), &mut varying, &mut keep);
        }
        // Users that compute something (SINK, END and AFTER only order effects).
        let mut users: HashMap<&UOp, Vec<&UOp>> = HashMap::new();
        for u in nodes.iter().filter(|u| !matches!(u.op(), Op::Sink | Op::End | Op::After)) {
            for s in u.src() {
                users.entry(s).or_default().push(u);
            }
        }
        let mut skipped: HashSet<UOp> = HashSet::new();
        self.splat_loads.clear();
        for u in nodes.iter().rev() {
            let only_packed = users.get(u).is_none_or(|us| us.iter().all(|w| skipped.contains(*w)));
            if varying.contains(*u) && !keep.contains(*u) && only_packed {
                skipped.insert((*u).clone());
            } else if keep.contains(*u)
                && only_packed
                && u.as_load().is_some_and(|index| self.register_of(index).is_none())
            {
                // A shared load only splats use: loaded next to its splat instead, which x86
                // does in one broadcast load.
                skipped.insert((*u).clone());
                self.splat_loads.insert((*u).clone());
            }
        }
        skipped
    }

    /// The loop of a register tile over `range`, running `emit` once per reduce step.
    ///
    /// Two reduce steps per trip (at opt_level none): the loop-carried accumulators then need
    /// no register copies at the back edge (x64's FMA writes a multiplicand's register, so
    /// after one step every accumulator sits in another register).
    fn tile_loop(
        &mut self,
        range: &UOp,
        emit: &impl Fn(&mut Self) -> Result<(), JitError>,
    ) -> Result<(), JitError> {
        let unroll = self.tile_unroll;
        let trips = range_end(range)?.const_int().filter(|&t| unroll > 1 && t >= unroll);
        if let Some(trips) = trips {
            let main = trips - trips % unroll;
            let (start, end) = (self.b.ins().iconst(types::I64, 0), self.b.ins().iconst(types::I64, main));
            let copy_iv = self.b.declare_var(types::I64);
            self.counted_loop(LoopTest::Top, start, end, unroll, |l, iv| {
                for k in 0..unroll {
                    let base = l.b.use_var(iv);
                    let at = l.b.ins().iadd_imm_s(base, k);
                    l.b.def_var(copy_iv, at);
                    l.range_vars.insert(range.clone(), copy_iv);
                    // Steps after the first address memory as step 0 plus a constant offset.
                    let step0 = match l.copy_addrs.take() {
                        Some((_, _, addrs)) if k > 0 => addrs,
                        _ => StepAddresses::new(),
                    };
                    l.copy_addrs = Some((range.clone(), k, step0));
                    emit(l)?;
                }
                l.copy_addrs = None;
                Ok(())
            })?;
            if main < trips {
                let (start, end) =
                    (self.b.ins().iconst(types::I64, main), self.b.ins().iconst(types::I64, trips));
                self.counted_loop(LoopTest::Top, start, end, 1, |l, iv| {
                    l.range_vars.insert(range.clone(), iv);
                    emit(l)
                })?;
            }
        } else {
            let (start, end) = (self.b.ins().iconst(types::I64, 0), self.val(range_end(range)?)?);
            self.counted_loop(LoopTest::Top, start, end, 1, |l, iv| {
                l.range_vars.insert(range.clone(), iv);
                emit(l)
            })?;
        }
        Ok(())
    }

    /// The register accumulators updated as `acc = acc + x` (f32), each loaded and stored once.
    fn updates(&self, nodes: &[&UOp]) -> Vec<Update> {
        let mut touched: HashMap<u32, usize> = HashMap::new();
        let mut uses: HashMap<&UOp, usize> = HashMap::new();
        for u in nodes {
            for s in u.src() {
                *uses.entry(s).or_default() += 1;
            }
            if let Some(index) = u.memory_index()
                && let Some(var) = self.register_of(index)
            {
                *touched.entry(var.as_u32()).or_default() += 1;
            }
        }
        let mut found = Vec::new();
        for u in nodes {
            let Some(store) = u.as_store() else { continue };
            let Some(var) = self.register_of(store.index) else { continue };
            let add = store.value;
            let Some((BinaryOp::Add, lhs, rhs)) = add.as_binary() else { continue };
            if add.dtype() != DType::F32 {
                continue;
            }
            let is_acc = |x: &UOp| {
                x.as_load().is_some_and(|index| self.register_of(index) == Some(var))
                    && uses.get(x) == Some(&1)
            };
            let (acc_load, x) = match (is_acc(lhs), is_acc(rhs)) {
                (true, false) => (lhs, rhs),
                (false, true) => (rhs, lhs),
                _ => continue,
            };
            if touched.get(&var.as_u32()) == Some(&2) && uses.get(add) == Some(&1) {
                found.push(Update {
                    var,
                    acc_load: acc_load.clone(),
                    add: add.clone(),
                    store: (*u).clone(),
                    x: x.clone(),
                });
            }
        }
        found
    }

    /// An F32X4 holding four scalar variables; a splat when all four hold one constant.
    fn vector_of_vars(&mut self, vars: [Variable; LANES]) -> Value {
        let vals = vars.map(|v| self.b.use_var(v));
        let konst = |l: &Self, v: Value| {
            let inst = l.b.func.dfg.value_def(v).inst()?;
            match l.b.func.dfg.insts[inst] {
                cranelift_codegen::ir::InstructionData::UnaryIeee32 { imm, .. } => Some(imm.bits()),
                _ => None,
            }
        };
        let first = konst(self, vals[0]);
        if first.is_some() && vals.iter().all(|&v| konst(self, v) == first) {
            return self.b.ins().splat(types::F32X4, vals[0]);
        }
        let mut v = self.b.ins().splat(types::F32X4, vals[0]);
        for (lane, &x) in vals.iter().enumerate().skip(1) {
            v = self.b.ins().insertlane(v, x, lane as u8);
        }
        v
    }

    /// `acc + x` over four lanes, contracted to one FMA when `x` is a product.
    fn packed_add(
        &mut self,
        xs: &[UOp; LANES],
        acc: Value,
        memo: &mut HashMap<[UOp; LANES], Value>,
    ) -> Result<Value, JitError> {
        if self.use_fma && self.contract && xs.iter().all(is_mul) {
            let a = self.packed(&xs.clone().map(|x| x.src()[0].clone()), memo)?;
            let b = self.packed(&xs.clone().map(|x| x.src()[1].clone()), memo)?;
            return Ok(self.b.ins().fma(a, b, acc));
        }
        let x = self.packed(xs, memo)?;
        Ok(self.b.ins().fadd(acc, x))
    }

    /// The F32X4 whose lane `k` is the value of `lanes[k]`.
    pub(super) fn packed(
        &mut self,
        lanes: &[UOp; LANES],
        memo: &mut HashMap<[UOp; LANES], Value>,
    ) -> Result<Value, JitError> {
        let u = &lanes[0];
        // A splat of a load is loaded again at every use: single-use, it becomes one
        // `vbroadcastss mem`, and as the FMA's tied first operand it needs no copy.
        let fresh = self.fresh_splats && lanes.iter().all(|x| x == u) && self.splat_loads.contains(u);
        if let Some(&v) = memo.get(lanes).filter(|_| !fresh) {
            return Ok(v);
        }
        let v = if lanes.iter().all(|x| x == u) {
            let s = if self.splat_loads.contains(u) {
                let index = u.as_load().ok_or_else(|| malformed(u))?;
                let Ok((addr, offset)) = self.address_parts(index)? else {
                    return Err(JitError::Internal("splat load of a register".into()));
                };
                let flags = self.load_flags(u, MemFlagsData::trusted());
                self.b.ins().load(types::F32, flags, addr, offset)
            } else {
                self.scalar_value(u)?
            };
            self.b.ins().splat(types::F32X4, s)
        } else if let Some(v) = self.tile_vector_of(u) {
            // Lane k of a register tile's vector (plan_packed_stores proved the lanes).
            v
        } else {
            match u.op() {
                Op::Load => {
                    // find_packs proved lane k reads element i + k: one unaligned vector load.
                    let index = u.as_load().ok_or_else(|| malformed(u))?;
                    let Ok((addr, offset)) = self.address_parts(index)? else {
                        return Err(JitError::Internal("packed load of a register".into()));
                    };
                    let flags = self.load_flags(u, MemFlagsData::new().with_notrap());
                    self.b.ins().load(types::F32X4, flags, addr, offset)
                }
                Op::Binary(BinaryOp::Add)
                    if self.use_fma && self.contract && lanes.iter().all(|x| is_mul(&x.src()[0])) =>
                {
                    let a = self.packed(&lanes.clone().map(|x| x.src()[0].src()[0].clone()), memo)?;
                    let b = self.packed(&lanes.clone().map(|x| x.src()[0].src()[1].clone()), memo)?;
                    let c = self.packed(&lanes.clone().map(|x| x.src()[1].clone()), memo)?;
                    self.b.ins().fma(a, b, c)
                }
                Op::Binary(op) => {
                    let a = self.packed(&lanes.clone().map(|x| x.src()[0].clone()), memo)?;
                    let b = self.packed(&lanes.clone().map(|x| x.src()[1].clone()), memo)?;
                    match op {
                        BinaryOp::Add => self.b.ins().fadd(a, b),
                        BinaryOp::Sub => self.b.ins().fsub(a, b),
                        BinaryOp::Mul => self.b.ins().fmul(a, b),
                        BinaryOp::Max => self.fmax(a, b),
                        _ => return Err(JitError::Internal(format!("cannot pack {}", u.short()))),
                    }
                }
                Op::Unary(op) => {
                    let a = self.packed(&lanes.clone().map(|x| x.src()[0].clone()), memo)?;
                    match op {
                        UnaryOp::Neg => self.b.ins().fneg(a),
                        UnaryOp::Sqrt => self.b.ins().sqrt(a),
                        UnaryOp::Exp2 => self.exp2_f32(a),
                        UnaryOp::Recip => {
                            let one = self.fconst(types::F32X4, 1.0);
                            self.b.ins().fdiv(one, a)
                        }
                        UnaryOp::Log2 => {
                            return Err(JitError::Internal(format!("cannot pack {}", u.short())));
                        }
                    }
                }
                _ => return Err(JitError::Internal(format!("cannot pack {}", u.short()))),
            }
        };
        if !fresh {
            memo.insert(lanes.clone(), v);
        }
        Ok(v)
    }

    /// The register tile vector whose lane a LOAD of a tile accumulator reads.
    fn tile_vector_of(&self, load: &UOp) -> Option<Value> {
        let var = self.register_of(load.as_load()?)?;
        self.tile_results.get(&var.as_u32()).map(|t| t.0)
    }

    /// `flags`, plus `readonly` when `load` reads a buffer the program never writes.
    fn load_flags(&self, load: &UOp, flags: MemFlagsData) -> MemFlagsData {
        match load.memory_index().and_then(UOp::indexed_base) {
            Some(base) if self.read_only.contains(base) => flags.with_readonly(),
            _ => flags,
        }
    }

    /// The scalar value of a node shared by all lanes; a product contracted into a (skipped)
    /// scalar FMA is computed here.
    fn scalar_value(&mut self, u: &UOp) -> Result<Value, JitError> {
        if self.contracted.contains(u) && !self.vals.contains_key(u) {
            let (_, x, y) = u.as_binary().ok_or_else(|| malformed(u))?;
            let (a, b) = (self.val(x)?, self.val(y)?);
            let v = self.b.ins().fmul(a, b);
            self.vals.insert(u.clone(), v);
            return Ok(v);
        }
        self.val(u)
    }
}

/// Greedy packing: each update, in body order, with the first three unpacked updates whose
/// trees read one element, two and three elements further along.
fn find_packs(
    updates: &[Update],
    in_body: &dyn Fn(&UOp) -> bool,
    in_memory: &dyn Fn(&UOp) -> bool,
) -> Vec<[usize; LANES]> {
    let ctx = LaneCtx { in_body, in_memory };
    let mut memo = HashMap::new();
    let mut used = vec![false; updates.len()];
    let mut packs = Vec::new();
    for a in 0..updates.len() {
        if used[a] {
            continue;
        }
        let mut lanes = [a; LANES];
        let mut varying: Option<Vec<UOp>> = None;
        for (step, lane) in lanes.iter_mut().enumerate().skip(1) {
            // The first unused update whose varying loads sit `step` elements further along
            // (the same loads as the lanes before it vary), with those loads.
            let found = (0..updates.len()).filter(|&b| !used[b] && b != a).find_map(|b| {
                let mut loads = Vec::new();
                let ok = ctx.lane_offset(&updates[a].x, &updates[b].x, step as i64, &mut loads, &mut memo);
                (ok && !loads.is_empty() && varying.as_ref().is_none_or(|v| *v == loads))
                    .then_some((b, loads))
            });
            let Some((b, loads)) = found else { break };
            *lane = b;
            varying.get_or_insert(loads);
        }
        if lanes[1..].iter().all(|&k| k != a) {
            for &k in &lanes {
                used[k] = true;
            }
            packs.push(lanes);
        }
    }
    packs
}

/// What [`LaneCtx::lane_offset`] needs to know about the loop body.
struct LaneCtx<'a> {
    /// Computed in the loop body (anything else is loop-invariant, hence shared).
    in_body: &'a dyn Fn(&UOp) -> bool,
    /// The BUFFER or ALLOC lives in memory (not in registers), so a vector load can read it.
    in_memory: &'a dyn Fn(&UOp) -> bool,
}

impl LaneCtx<'_> {
    /// Whether `b` is `a` with every differing load reading `step` elements further, all else
    /// the same node; `loads` collects `a`'s differing loads (the positions that vary).
    fn lane_offset(
        &self,
        a: &UOp,
        b: &UOp,
        step: i64,
        loads: &mut Vec<UOp>,
        memo: &mut HashMap<UOp, UOp>,
    ) -> bool {
        if a == b {
            return true;
        }
        if !(self.in_body)(a)
            || !(self.in_body)(b)
            || !packable(a)
            || a.op() != b.op()
            || a.src().len() != b.src().len()
        {
            return false;
        }
        if let Op::Load = a.op() {
            let (Some(ia), Some(ib)) =
                (a.as_load().and_then(UOp::as_index), b.as_load().and_then(UOp::as_index))
            else {
                return false;
            };
            let (Some(va), Some(vb)) = (view_base(ia.base), view_base(ib.base)) else {
                return false;
            };
            if va != vb || !(self.in_memory)(va) || ia.offset.dtype() != ib.offset.dtype() {
                return false;
            }
            let diff = simplify_memo(&(ib.offset - ia.offset), Default::default(), memo);
            if diff.const_int() != Some(step) {
                return false;
            }
            loads.push(a.clone());
            return true;
        }
        a.src().iter().zip(b.src()).all(|(x, y)| self.lane_offset(x, y, step, loads, memo))
    }
}

/// Adds the nodes where the lanes differ (of every lane) to `varying`, and the shared nodes
/// the packed tree splats to `shared`. Stops at loads: their indices stay scalar code.
fn collect_varying(lanes: &[UOp; LANES], varying: &mut HashSet<UOp>, shared: &mut HashSet<UOp>) {
    if lanes.iter().all(|x| *x == lanes[0]) {
        shared.insert(lanes[0].clone());
        return;
    }
    varying.extend(lanes.iter().cloned());
    if matches!(lanes[0].op(), Op::Load) {
        return;
    }
    for s in 0..lanes[0].src().len() {
        collect_varying(&lanes.clone().map(|x| x.src()[s].clone()), varying, shared);
    }
}
