//! Counted loops: the plain form, split reductions (unrolled with independent partial sums)
//! and scalar tails.

use super::*;

/// Where a counted loop tests its bound.
#[derive(Clone, Copy)]
pub(crate) enum LoopTest {
    /// At the bottom, after a test on entry (none when the loop is known to run): one branch
    /// per trip.
    Bottom,
    /// At the top, for loops that carry register values (accumulators) out: the exit then
    /// reads them as the header's block parameters. With the test at the bottom, each value
    /// leaving the last iteration is used twice, by the back edge and after the loop, and
    /// Cranelift then counts every value it depends on as used more than once and folds none
    /// of the body's loads into their users (a splat of a load stays `movss` + `vbroadcastss
    /// reg` instead of one `vbroadcastss mem`).
    Top,
}

/// The trip count of an innermost loop that may be unrolled or vectorized.
#[derive(Clone, Copy)]
pub(crate) enum Trips {
    /// A constant.
    Fixed(i64),
    /// A formula of the program's variables, computed before the loop (`end`), at most `max`.
    Runtime {
        /// The trip count.
        end: Value,
        /// Its upper bound (the variables' declared bounds give it).
        max: i64,
    },
}

impl Trips {
    /// The largest trip count possible.
    pub(crate) fn max(self) -> i64 {
        match self {
            Trips::Fixed(n) => n,
            Trips::Runtime { max, .. } => max,
        }
    }
}

/// Where the main loop of a loop unrolled `step` times ends: the largest multiple of `step` not
/// above the trip count, a constant when the trip count is one.
#[derive(Clone, Copy)]
pub(crate) enum MainEnd {
    /// A constant.
    Fixed(i64),
    /// Computed before the loop.
    Runtime(Value),
}

/// Independent partial sums a split reduction keeps.
const SPLIT: usize = 4;
/// Innermost loops with at most this many statements are unrolled `SPLIT` times.
const MAX_UNROLLED_BODY: usize = 96;

impl Lowerer<'_, '_> {
    pub(super) fn lower_loop(&mut self, range: &UOp, body: &[Stmt]) -> Result<(), JitError> {
        let is_thread = matches!(range.op(), Op::Range { axis: uopc_ir::AxisType::Thread, .. });
        // A loop of tile ops is a loop of calls: nothing to vectorize or unroll.
        let innermost = body.iter().all(|s| matches!(s, Stmt::Op(u) if !matches!(u.op(), Op::Tile(_))));
        if !is_thread && innermost && self.vectorize && self.try_tile(range, body)? {
            return Ok(());
        }
        if !is_thread
            && innermost
            && let Some(trips) = self.unrollable_trips(range)?
        {
            if self.vectorize && self.try_vectorize(range, body, trips)? {
                return Ok(());
            }
            if self.reassociate && trips.max() >= 2 * SPLIT as i64 && body.len() <= MAX_UNROLLED_BODY {
                let accs = self.sum_accumulators(body);
                return self.lower_split_reduction(range, body, trips, &accs);
            }
        }
        let (start, end) = if is_thread {
            (self.lo, self.hi)
        } else {
            let zero = self.b.ins().iconst(types::I64, 0);
            (zero, self.val(range_end(range)?)?)
        };
        self.counted_loop(LoopTest::Bottom, start, end, 1, |l, iv| {
            l.range_vars.insert(range.clone(), iv);
            l.block(body)
        })
    }

    /// The trip count of `range` when its loop may be unrolled or vectorized: a constant, or a
    /// formula of variables and enclosing ranges (computed before the loop, with an upper bound
    /// from their bounds), such as a row's masked suffix in a triangle. Ends that depend on
    /// memory keep the plain loop.
    fn unrollable_trips(&mut self, range: &UOp) -> Result<Option<Trips>, JitError> {
        let end = range_end(range)?;
        if let Some(n) = end.const_int() {
            return Ok(Some(Trips::Fixed(n)));
        }
        let integer_math = |u: &UOp| u.dtype().is_int() || u.dtype() == DType::Bool;
        let before_the_loop = UOp::toposort(std::slice::from_ref(end)).iter().all(|u| {
            integer_math(u)
                && matches!(
                    u.op(),
                    Op::Const(_)
                        | Op::Var { .. }
                        | Op::Range { .. }
                        | Op::Unary(_)
                        | Op::Binary(_)
                        | Op::Where
                )
        });
        if !before_the_loop {
            return Ok(None);
        }
        Ok(Some(Trips::Runtime { end: self.val(end)?, max: end.vmax() }))
    }

    /// The end of the main loop of a loop unrolled `step` times: `trips` rounded down to a
    /// multiple of `step`, 0 for a negative trip count. A runtime count is masked for a power
    /// of two and reduced by its remainder otherwise (three vector copies step by 12).
    pub(super) fn main_end(&mut self, trips: Trips, step: i64) -> MainEnd {
        debug_assert!(step > 0, "step {step} is positive");
        match trips {
            Trips::Fixed(n) => MainEnd::Fixed(n - n % step),
            Trips::Runtime { end, .. } => {
                let zero = self.b.ins().iconst(types::I64, 0);
                let nonnegative = self.b.ins().smax(end, zero);
                MainEnd::Runtime(if step & (step - 1) == 0 {
                    self.b.ins().band_imm_s(nonnegative, -step)
                } else {
                    let rest = self.b.ins().urem_imm_s(nonnegative, step);
                    self.b.ins().isub(nonnegative, rest)
                })
            }
        }
    }

    /// The value of a main loop's end.
    pub(super) fn main_end_value(&mut self, main: MainEnd) -> Value {
        match main {
            MainEnd::Fixed(m) => self.b.ins().iconst(types::I64, m),
            MainEnd::Runtime(v) => v,
        }
    }

    /// The iterations from `main` to the end of `range`, one at a time: the tail after an
    /// unrolled or vectorized main loop.
    pub(super) fn tail(
        &mut self,
        range: &UOp,
        body: &[Stmt],
        main: MainEnd,
        trips: Trips,
    ) -> Result<(), JitError> {
        match (main, trips) {
            (MainEnd::Fixed(m), Trips::Fixed(n)) => self.scalar_tail(range, body, m, n),
            (main, trips) => {
                let start = self.main_end_value(main);
                let end = match trips {
                    Trips::Fixed(n) => self.b.ins().iconst(types::I64, n),
                    Trips::Runtime { end, .. } => end,
                };
                self.counted_loop(LoopTest::Bottom, start, end, 1, |l, iv| {
                    l.range_vars.insert(range.clone(), iv);
                    l.block(body)
                })
            }
        }
    }

    /// Emits `for iv in (start..end).step_by(step) { body(iv) }`; `iv` is a Variable.
    pub(super) fn counted_loop(
        &mut self,
        test: LoopTest,
        start: Value,
        end: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Variable) -> Result<(), JitError>,
    ) -> Result<(), JitError> {
        // Stack addresses are reused only within straight-line code: kept across a loop they
        // hold general registers the loop needs (and get spilled and reloaded in it).
        self.slot_addrs.clear();
        let iv = self.b.declare_var(types::I64);
        self.b.def_var(iv, start);
        let body_blk = self.b.create_block();
        let exit_blk = self.b.create_block();
        let header = match test {
            LoopTest::Bottom => {
                match (self.iconst_of(start), self.iconst_of(end)) {
                    (Some(s), Some(e)) if s < e => {
                        self.b.ins().jump(body_blk, &[]);
                    }
                    _ => {
                        let enter = self.b.ins().icmp(IntCC::SignedLessThan, start, end);
                        self.b.ins().brif(enter, body_blk, &[], exit_blk, &[]);
                    }
                }
                None
            }
            LoopTest::Top => {
                let header = self.b.create_block();
                self.b.ins().jump(header, &[]);
                self.b.switch_to_block(header);
                let i = self.b.use_var(iv);
                let go = self.b.ins().icmp(IntCC::SignedLessThan, i, end);
                self.b.ins().brif(go, body_blk, &[], exit_blk, &[]);
                Some(header)
            }
        };
        self.b.switch_to_block(body_blk);
        body(self, iv)?;
        let i = self.b.use_var(iv);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.b.def_var(iv, next);
        match header {
            Some(header) => {
                self.b.ins().jump(header, &[]);
            }
            None => {
                let again = self.b.ins().icmp(IntCC::SignedLessThan, next, end);
                self.b.ins().brif(again, body_blk, &[] as &[BlockArg], exit_blk, &[]);
            }
        }
        self.b.switch_to_block(exit_blk);
        self.slot_addrs.clear();
        Ok(())
    }

    /// The value of `v` when it is an integer constant.
    pub(super) fn iconst_of(&self, v: Value) -> Option<i64> {
        let inst = self.b.func.dfg.value_def(v).inst()?;
        match self.b.func.dfg.insts[inst] {
            cranelift_codegen::ir::InstructionData::UnaryImm { imm, .. } => Some(imm.bits()),
            _ => None,
        }
    }

    /// Register accumulators updated as `acc = acc + x` (and only so) in a loop body without
    /// inner loops: the loop-carried chains worth splitting.
    pub(super) fn sum_accumulators(&self, body: &[Stmt]) -> Vec<Variable> {
        let mut found: Vec<Variable> = Vec::new();
        let mut touched: HashMap<u32, usize> = HashMap::new();
        let mut uses: HashMap<&UOp, usize> = HashMap::new();
        for s in body {
            if let Stmt::Op(u) = s {
                for x in u.src() {
                    *uses.entry(x).or_default() += 1;
                }
            }
        }
        for s in body {
            let Stmt::Op(u) = s else { return Vec::new() };
            let Some(index) = u.memory_index() else { continue };
            let Some(var) = self.register_of(index) else { continue };
            *touched.entry(var.as_u32()).or_default() += 1;
            if let Some(store) = u.as_store() {
                let v = store.value;
                // `acc = acc + x` where the loaded accumulator feeds nothing else: a sum whose
                // terms do not read the running value, so it may be split.
                let is_sum = matches!(v.op(), Op::Binary(BinaryOp::Add))
                    && v.dtype().is_float()
                    && v.src().iter().any(|x| x.as_load() == Some(index) && uses.get(x) == Some(&1));
                if is_sum {
                    found.push(var);
                }
            }
        }
        // exactly one load and one store of the accumulator in the body
        found.retain(|v| touched.get(&v.as_u32()) == Some(&2));
        found
    }

    /// An innermost loop unrolled `SPLIT` times, with its float sums split into `SPLIT`
    /// independent partial sums (reassociation, like `-fassociative-math`): it breaks the one
    /// long add-latency chain that otherwise bounds a dot product. A tail loop finishes.
    pub(super) fn lower_split_reduction(
        &mut self,
        range: &UOp,
        body: &[Stmt],
        trips: Trips,
        accs: &[Variable],
    ) -> Result<(), JitError> {
        // Enough independent chains to cover the add latency: a body that already has many
        // accumulators (a register tile) keeps one chain each and is only unrolled.
        let chains = match accs.len() {
            _ if !self.reassociate => 1,
            0 => 1,
            1 | 2 => SPLIT,
            3 | 4 => 2,
            _ => 1,
        };
        let ty_of = |l: &mut Self, v: Variable| {
            let x = l.b.use_var(v);
            l.b.func.dfg.value_type(x)
        };
        // partials[k][a]: partial sum k of accumulator a; partial 0 starts from the current value.
        let mut partials: Vec<Vec<Variable>> = Vec::new();
        for k in 0..chains {
            let mut row = Vec::new();
            for &acc in accs {
                let ty = ty_of(self, acc);
                let p = self.b.declare_var(ty);
                let init = if k == 0 {
                    self.b.use_var(acc)
                } else if ty == types::F32 {
                    self.b.ins().f32const(0.0)
                } else {
                    self.b.ins().f64const(0.0)
                };
                self.b.def_var(p, init);
                row.push(p);
            }
            partials.push(row);
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        let main = self.main_end(trips, SPLIT as i64);
        let end = self.main_end_value(main);
        let copy_iv = self.b.declare_var(types::I64);
        self.counted_loop(LoopTest::Bottom, zero, end, SPLIT as i64, |l, iv| {
            for k in 0..SPLIT {
                let row = &partials[k % chains];
                let base = l.b.use_var(iv);
                let ivk = l.b.ins().iadd_imm_s(base, k as i64);
                l.b.def_var(copy_iv, ivk);
                l.range_vars.insert(range.clone(), copy_iv);
                l.partial = accs.iter().copied().zip(row.iter().copied()).collect();
                l.block(body)?;
            }
            l.partial.clear();
            Ok(())
        })?;
        // Combine pairwise, then finish the tail on the real accumulators.
        for (a, &acc) in accs.iter().enumerate() {
            let mut vals: Vec<Value> = partials.iter().map(|row| self.b.use_var(row[a])).collect();
            while vals.len() > 1 {
                vals = vals
                    .chunks(2)
                    .map(|c| if c.len() == 2 { self.b.ins().fadd(c[0], c[1]) } else { c[0] })
                    .collect();
            }
            self.b.def_var(acc, vals[0]);
        }
        self.tail(range, body, main, trips)
    }

    /// The iterations `from..trips` of `range`, one at a time: the tail after an unrolled or
    /// vectorized main loop.
    pub(super) fn scalar_tail(
        &mut self,
        range: &UOp,
        body: &[Stmt],
        from: i64,
        trips: i64,
    ) -> Result<(), JitError> {
        if from >= trips {
            return Ok(());
        }
        let start = self.b.ins().iconst(types::I64, from);
        let end = self.b.ins().iconst(types::I64, trips);
        self.counted_loop(LoopTest::Bottom, start, end, 1, |l, iv| {
            l.range_vars.insert(range.clone(), iv);
            l.block(body)
        })
    }
}

/// The trip count of a loop's RANGE; an internal error for any other node, since only a RANGE
/// opens a loop in a verified program.
pub(super) fn range_end(range: &UOp) -> Result<&UOp, JitError> {
    range
        .as_range()
        .map(|r| r.end)
        .ok_or_else(|| JitError::Internal(format!("{}: loop over a non-RANGE", range.short())))
}
