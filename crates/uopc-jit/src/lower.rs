//! Lowering of a linearized loop program to Cranelift IR.
//!
//! The function signature is `(bufs: *const *mut u8, lo: i64, hi: i64)`: buffer pointers by
//! slot, and the slice `lo..hi` of the THREAD range this call runs. Scalar accumulators become
//! `Variable`s (Cranelift builds the SSA), arrays indexed by a loop variable become stack slots.

use crate::JitError;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, BlockArg, FuncRef, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type,
    Value, types,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use std::collections::HashMap;
use uopc_ir::{BinaryOp, ConstValue, DType, Linear, Op, Stmt, TileOp, UOp, UnaryOp, split_linear, view_base};

mod tile;
mod vector;

/// Host functions the generated code may call (never per element on the f32 fast paths).
#[derive(Clone, Copy)]
pub(crate) struct Externs {
    pub exp2_f64: FuncRef,
    pub log2_f32: FuncRef,
    pub log2_f64: FuncRef,
    /// `uopc_tile::uopc_tile_gemm_f32`.
    pub tile_gemm: FuncRef,
    /// `uopc_tile::uopc_tile_softmax_update_f32`.
    pub tile_softmax: FuncRef,
}

/// Names and addresses of the host functions in [`Externs`]; every one is registered explicitly.
pub(crate) const EXTERN_SYMBOLS: [(&str, *const u8); 5] = [
    ("uopc_exp2_f64", uopc_exp2_f64 as *const u8),
    ("uopc_log2_f32", uopc_log2_f32 as *const u8),
    ("uopc_log2_f64", uopc_log2_f64 as *const u8),
    ("uopc_tile_gemm_f32", uopc_tile::uopc_tile_gemm_f32 as *const u8),
    ("uopc_tile_softmax_update_f32", uopc_tile::uopc_tile_softmax_update_f32 as *const u8),
];

extern "C" fn uopc_exp2_f64(x: f64) -> f64 {
    x.exp2()
}
extern "C" fn uopc_log2_f32(x: f32) -> f32 {
    x.log2()
}
extern "C" fn uopc_log2_f64(x: f64) -> f64 {
    x.log2()
}

/// Signature of every external in [`EXTERN_SYMBOLS`], by index.
pub(crate) fn extern_signature(k: usize, sig: &mut cranelift_codegen::ir::Signature) {
    let ints = |sig: &mut cranelift_codegen::ir::Signature, n: usize| {
        sig.params.extend((0..n).map(|_| AbiParam::new(types::I64)));
        sig.returns.push(AbiParam::new(types::I32));
    };
    match k {
        // (a, b, c, m, n, k, lda, ldb, ldc, flags) -> status
        3 => ints(sig, 10),
        // (s, row_max, row_sum, o, rows, cols, lds, ldo, d) -> status
        4 => ints(sig, 9),
        _ => {
            let t = if k == 1 { types::F32 } else { types::F64 };
            sig.params.push(AbiParam::new(t));
            sig.returns.push(AbiParam::new(t));
        }
    }
}

/// Float MULs used exactly once, by a float ADD: `a*b + c` becomes `fma(a, b, c)` (like
/// `-ffp-contract=fast`: one rounding instead of two).
fn contractible_muls(stmts: &[(usize, &Stmt)]) -> std::collections::HashSet<UOp> {
    let mut uses: HashMap<UOp, usize> = HashMap::new();
    let mut add_operands: Vec<UOp> = Vec::new();
    for (_, s) in stmts {
        let Stmt::Op(u) = s else { continue };
        for x in u.src() {
            *uses.entry(x.clone()).or_default() += 1;
        }
        if matches!(u.op(), Op::Binary(BinaryOp::Add)) && u.dtype().is_float() && u.src()[0] != u.src()[1] {
            // one contraction per ADD: the first MUL operand
            if let Some(m) = u.src().iter().find(|x| matches!(x.op(), Op::Binary(BinaryOp::Mul))) {
                add_operands.push(m.clone());
            }
        }
    }
    add_operands.into_iter().filter(|m| uses.get(m) == Some(&1)).collect()
}

/// `e` as `x + c` with a constant `c` (`x` = 0 when `e` is a constant), and `c * size` as a
/// byte offset when it fits a memory op's immediate.
pub(crate) fn split_constant_term(e: &UOp, size: i64) -> Option<(UOp, i32)> {
    let bytes = |c: i64| i32::try_from(c.checked_mul(size)?).ok();
    match (e.op(), e.const_int()) {
        (_, Some(c)) => Some((uopc_ir::idx(0), bytes(c)?)),
        (Op::Binary(BinaryOp::Add), None) => Some((e.src()[0].clone(), bytes(e.src()[1].const_int()?)?)),
        _ => None,
    }
}

pub(crate) fn clif_type(d: DType) -> Type {
    match d {
        DType::Bool => types::I8,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::F32 => types::F32,
        DType::F64 => types::F64,
    }
}

/// Code generation switches of one compile.
#[derive(Clone, Copy)]
pub(crate) struct Flags {
    /// The CPU has fused multiply-add (without it Cranelift would call `fmaf`).
    pub fma: bool,
    /// Contract MUL+ADD into FMA.
    pub contract: bool,
    /// Split float sums into partial sums.
    pub reassociate: bool,
    /// Run innermost f32 loops four iterations at a time in F32X4 values.
    pub vectorize: bool,
    /// Reduce steps per trip of a register tile's loop.
    pub tile_unroll: i64,
    /// Cranelift keeps the emitted order (`opt_level=none`): no GVN merges equal loads.
    pub keeps_order: bool,
}

/// The ALLOCs kept in registers: at most 32 elements, only ever indexed by constants, and no
/// tile op's operand (those need memory).
fn register_allocs(lin: &Linear, all: &[(usize, &Stmt)]) -> std::collections::HashSet<UOp> {
    let tile_operands: std::collections::HashSet<&UOp> = all
        .iter()
        .filter_map(|(_, s)| match s {
            Stmt::Op(u) if matches!(u.op(), Op::Tile(_)) => {
                Some(u.src().iter().filter_map(|x| view_base(&x.src()[0])))
            }
            _ => None,
        })
        .flatten()
        .collect();
    lin.allocs
        .iter()
        .filter(|a| {
            !tile_operands.contains(a)
                && matches!(a.op(), Op::Alloc { len, .. } if *len <= 32)
                && all.iter().all(|(_, s)| match s {
                    Stmt::Op(u) if matches!(u.op(), Op::Index) && view_base(&u.src()[0]) == Some(*a) => {
                        u.src()[1].const_int().is_some()
                    }
                    _ => true,
                })
        })
        .cloned()
        .collect()
}

/// A GEMM-like kernel: some innermost loop updates four or more register accumulators with
/// `acc = acc + x` (a register tile), and nothing computes an exp2, log2, sqrt or reciprocal.
/// [`crate::OptLevel::Auto`] compiles these at `none`.
pub(crate) fn gemm_like(lin: &Linear) -> bool {
    let all = lin.walk();
    if all
        .iter()
        .any(|(_, s)| matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Unary(op) if *op != UnaryOp::Neg)))
    {
        return false;
    }
    let registers = register_allocs(lin, &all);
    let in_registers = |index: &UOp| view_base(&index.src()[0]).is_some_and(|b| registers.contains(b));
    let mut tiles = false;
    for (_, s) in &all {
        let Stmt::Loop { body, .. } = s else { continue };
        if !body.iter().all(|s| matches!(s, Stmt::Op(_))) {
            continue;
        }
        let updates = body
            .iter()
            .filter(|s| match s {
                Stmt::Op(u) => {
                    matches!(u.op(), Op::Store)
                        && in_registers(&u.src()[0])
                        && matches!(u.src()[1].op(), Op::Binary(BinaryOp::Add))
                }
                _ => false,
            })
            .count();
        tiles |= updates >= 4;
    }
    tiles
}

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

/// Independent partial sums a split reduction keeps.
const SPLIT: usize = 4;
/// Innermost loops with at most this many statements are unrolled `SPLIT` times.
const MAX_UNROLLED_BODY: usize = 96;

/// Addresses (base value, immediate offset) of the INDEXes one unrolled step accessed.
pub(crate) type StepAddresses = HashMap<UOp, (Value, i32)>;

enum Storage {
    Vars(Vec<Variable>),
    Slot(StackSlot),
}

pub(crate) struct Lowerer<'a, 'b> {
    pub b: &'a mut FunctionBuilder<'b>,
    vals: HashMap<UOp, Value>,
    buf_ptrs: HashMap<UOp, Value>,
    storage: HashMap<UOp, Storage>,
    range_vars: HashMap<UOp, Variable>,
    externs: Externs,
    use_fma: bool,
    contract: bool,
    reassociate: bool,
    vectorize: bool,
    tile_unroll: i64,
    /// Float MULs whose only use is a float ADD: emitted as one `fma` at the ADD.
    contracted: std::collections::HashSet<UOp>,
    /// Accumulators a register tile left in an F32X4: variable -> (vector, lane, the
    /// variables of all four lanes). Valid until the variable is stored again.
    tile_results: HashMap<u32, (Value, usize, [Variable; 4])>,
    /// BUFFERs the program never stores to: their loads may be flagged `readonly`, which lets
    /// Cranelift place them next to their use (a load next to a splat is one broadcast load).
    read_only: std::collections::HashSet<UOp>,
    /// Shared loads of the register tile being lowered that are only splatted: each is loaded
    /// next to its splat.
    splat_loads: std::collections::HashSet<UOp>,
    /// Emit a splat of a load afresh at every use (see `packed`): where Cranelift keeps the
    /// copies apart (at `speed` it merges equal loads back into one).
    fresh_splats: bool,
    /// Addresses of stack slots computed in the straight-line code being emitted (cleared at
    /// every loop entry and exit): one `lea` per slot and stretch instead of one per access at
    /// `opt_level=none`.
    slot_addrs: HashMap<StackSlot, Value>,
    /// While lowering the unrolled steps of a register tile: its range, the step being emitted,
    /// and step 0's addresses by INDEX (later steps add their offset to those).
    pub(crate) copy_addrs: Option<(UOp, i64, StepAddresses)>,
    /// While lowering one unrolled copy of a split reduction: accumulator -> its partial sum.
    partial: Vec<(Variable, Variable)>,
    bufs: Value,
    lo: Value,
    hi: Value,
}

fn mem() -> MemFlagsData {
    // In bounds (proven by the verifier) and naturally aligned (slices of the element type).
    MemFlagsData::trusted()
}

impl<'a, 'b> Lowerer<'a, 'b> {
    pub fn new(
        b: &'a mut FunctionBuilder<'b>,
        externs: Externs,
        flags: Flags,
        bufs: Value,
        lo: Value,
        hi: Value,
    ) -> Self {
        Lowerer {
            b,
            vals: HashMap::new(),
            buf_ptrs: HashMap::new(),
            storage: HashMap::new(),
            range_vars: HashMap::new(),
            externs,
            use_fma: flags.fma,
            contract: flags.contract,
            reassociate: flags.reassociate,
            vectorize: flags.vectorize,
            tile_unroll: flags.tile_unroll,
            partial: Vec::new(),
            splat_loads: Default::default(),
            fresh_splats: flags.keeps_order,
            slot_addrs: HashMap::new(),
            copy_addrs: None,
            read_only: Default::default(),
            tile_results: HashMap::new(),
            contracted: Default::default(),
            bufs,
            lo,
            hi,
        }
    }

    /// Declares buffers and local storage, then lowers every statement.
    pub fn lower(&mut self, lin: &Linear) -> Result<(), JitError> {
        for buf in &lin.buffers {
            if let Op::Buffer { slot, .. } = buf.op() {
                let p = self.b.ins().load(types::I64, mem(), self.bufs, (*slot as i32) * 8);
                self.buf_ptrs.insert(buf.clone(), p);
            }
        }
        let all = lin.walk();
        let written: std::collections::HashSet<UOp> =
            crate::written_bases(all.iter().filter_map(|(_, s)| match s {
                Stmt::Op(u) => Some(u),
                _ => None,
            }))
            .into_iter()
            .collect();
        self.read_only = lin.buffers.iter().filter(|b| !written.contains(b)).cloned().collect();
        if self.use_fma && self.contract {
            self.contracted = contractible_muls(&all);
        }
        let registers = register_allocs(lin, &all);
        for a in &lin.allocs {
            let Op::Alloc { len, .. } = a.op() else { continue };
            let ty = clif_type(a.dtype());
            // Small ALLOCs only ever indexed by constants live in registers.
            let st = if registers.contains(a) {
                Storage::Vars((0..*len).map(|_| self.b.declare_var(ty)).collect())
            } else {
                let size = (*len * a.dtype().size()) as u32;
                let align = a.dtype().size().trailing_zeros() as u8;
                Storage::Slot(self.b.create_sized_stack_slot(StackSlotData::new(
                    StackSlotKind::ExplicitSlot,
                    size,
                    align,
                )))
            };
            self.storage.insert(a.clone(), st);
        }
        self.block(&lin.root)
    }

    fn block(&mut self, body: &[Stmt]) -> Result<(), JitError> {
        // Groups of scalar stores computed from a register tile's vectors: emitted as one
        // vector store at the last of each group, the rest skipped.
        let mut packed = tile::PackedStores::default();
        for (at, s) in body.iter().enumerate() {
            if let Some(plan) = packed.at.remove(&at) {
                self.emit_packed_store(&plan)?;
                continue;
            }
            if packed.skip.contains(&at) {
                continue;
            }
            match s {
                Stmt::Loop { range, body: inner } => {
                    self.lower_loop(range, inner)?;
                    // A register tile's results: stores computed from them may pack.
                    if self.vectorize {
                        let more = self.plan_packed_stores(body, at + 1);
                        packed.skip.extend(more.skip);
                        packed.at.extend(more.at);
                    }
                }
                Stmt::Op(u) => self.stmt(u)?,
            }
        }
        // A tile's vector is only known to dominate the rest of the block its loop is in.
        self.tile_results.clear();
        Ok(())
    }

    fn lower_loop(&mut self, range: &UOp, body: &[Stmt]) -> Result<(), JitError> {
        let is_thread = matches!(range.op(), Op::Range { axis: uopc_ir::AxisType::Thread, .. });
        // A loop of tile ops is a loop of calls: nothing to vectorize or unroll.
        let innermost = body.iter().all(|s| matches!(s, Stmt::Op(u) if !matches!(u.op(), Op::Tile(_))));
        if !is_thread && innermost && self.vectorize && self.try_tile(range, body)? {
            return Ok(());
        }
        if !is_thread
            && innermost
            && let Some(trips) = range.src()[0].const_int()
        {
            if self.vectorize && self.try_vectorize(range, body, trips)? {
                return Ok(());
            }
            if self.reassociate && trips >= 2 * SPLIT as i64 && body.len() <= MAX_UNROLLED_BODY {
                let accs = self.sum_accumulators(body);
                return self.lower_split_reduction(range, body, trips, &accs);
            }
        }
        let (start, end) = if is_thread {
            (self.lo, self.hi)
        } else {
            let zero = self.b.ins().iconst(types::I64, 0);
            (zero, self.val(&range.src()[0])?)
        };
        self.counted_loop(LoopTest::Bottom, start, end, 1, |l, iv| {
            l.range_vars.insert(range.clone(), iv);
            l.block(body)
        })
    }

    /// Emits `for iv in (start..end).step_by(step) { body(iv) }`; `iv` is a Variable.
    fn counted_loop(
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
    fn iconst_of(&self, v: Value) -> Option<i64> {
        let inst = self.b.func.dfg.value_def(v).inst()?;
        match self.b.func.dfg.insts[inst] {
            cranelift_codegen::ir::InstructionData::UnaryImm { imm, .. } => Some(imm.bits()),
            _ => None,
        }
    }

    /// Register accumulators updated as `acc = acc + x` (and only so) in a loop body without
    /// inner loops: the loop-carried chains worth splitting.
    fn sum_accumulators(&self, body: &[Stmt]) -> Vec<Variable> {
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
            if !matches!(u.op(), Op::Load | Op::Store) {
                continue;
            }
            let Some(var) = self.register_of(&u.src()[0]) else { continue };
            *touched.entry(var.as_u32()).or_default() += 1;
            if let Op::Store = u.op() {
                let v = &u.src()[1];
                // `acc = acc + x` where the loaded accumulator feeds nothing else: a sum whose
                // terms do not read the running value, so it may be split.
                let is_sum = matches!(v.op(), Op::Binary(BinaryOp::Add))
                    && v.dtype().is_float()
                    && v.src().iter().any(|x| {
                        matches!(x.op(), Op::Load) && x.src()[0] == u.src()[0] && uses.get(x) == Some(&1)
                    });
                if is_sum {
                    found.push(var);
                }
            }
        }
        // exactly one load and one store of the accumulator in the body
        found.retain(|v| touched.get(&v.as_u32()) == Some(&2));
        found
    }

    fn register_of(&self, index: &UOp) -> Option<Variable> {
        if !matches!(index.op(), Op::Index) {
            return None;
        }
        match self.storage.get(view_base(&index.src()[0])?) {
            Some(Storage::Vars(vars)) => vars.get(index.src()[1].const_int()? as usize).copied(),
            _ => None,
        }
    }

    /// An innermost loop unrolled `SPLIT` times, with its float sums split into `SPLIT`
    /// independent partial sums (reassociation, like `-fassociative-math`): it breaks the one
    /// long add-latency chain that otherwise bounds a dot product. A tail loop finishes.
    fn lower_split_reduction(
        &mut self,
        range: &UOp,
        body: &[Stmt],
        trips: i64,
        accs: &[Variable],
    ) -> Result<(), JitError> {
        let main = trips - trips % SPLIT as i64;
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
        let end = self.b.ins().iconst(types::I64, main);
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
        self.scalar_tail(range, body, main, trips)
    }

    /// The iterations `from..trips` of `range`, one at a time: the tail after an unrolled or
    /// vectorized main loop.
    fn scalar_tail(&mut self, range: &UOp, body: &[Stmt], from: i64, trips: i64) -> Result<(), JitError> {
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

    fn constant(&mut self, c: ConstValue, d: DType) -> Value {
        match d {
            DType::F32 => self.b.ins().f32const(c.as_f64() as f32),
            DType::F64 => self.b.ins().f64const(c.as_f64()),
            _ => self.b.ins().iconst(clif_type(d), c.cast(d).as_i64()),
        }
    }

    fn val(&mut self, u: &UOp) -> Result<Value, JitError> {
        if let Some(c) = u.const_value() {
            return Ok(self.constant(c, u.dtype()));
        }
        if let Some(v) = self.range_vars.get(u) {
            return Ok(self.b.use_var(*v));
        }
        self.vals
            .get(u)
            .copied()
            .ok_or_else(|| JitError::Internal(format!("{} used before it is computed", u.short())))
    }

    /// The address of element 0 of the BUFFER or stack array an INDEX goes into.
    fn base_address(&mut self, index: &UOp) -> Result<Value, JitError> {
        let base =
            view_base(&index.src()[0]).ok_or_else(|| JitError::Internal("INDEX without base".into()))?;
        if let Some(p) = self.buf_ptrs.get(base).copied() {
            return Ok(p);
        }
        match self.storage.get(base) {
            Some(Storage::Slot(slot)) => {
                let slot = *slot;
                if let Some(&a) = self.slot_addrs.get(&slot) {
                    return Ok(a);
                }
                let a = self.b.ins().stack_addr(types::I64, slot, 0);
                self.slot_addrs.insert(slot, a);
                Ok(a)
            }
            _ => Err(JitError::Internal(format!("{} has no memory", base.short()))),
        }
    }

    /// `base + i * 4`: the address of f32 (or i32) element `i`.
    fn element_address(&mut self, base: Value, i: Value) -> Value {
        let off = self.scale_index(i, 4);
        self.b.ins().iadd(base, off)
    }

    /// The address of a BUFFER or stack-slot element, or the variable of a register ALLOC.
    fn address(&mut self, index: &UOp) -> Result<Result<Value, Variable>, JitError> {
        Ok(match self.address_parts(index)? {
            Ok((p, 0)) => Ok(p),
            Ok((p, offset)) => Ok(self.b.ins().iadd_imm_s(p, offset as i64)),
            Err(var) => Err(var),
        })
    }

    /// [`Self::address`] as a pointer and a byte offset for the memory op's immediate: an
    /// index `x + c` with constant `c` addresses from `x`, so accesses that differ by
    /// constants (a register tile's rows, unrolled copies) share one pointer and x64 folds
    /// `base + (x << k) + disp` into each access instead of computing every sum.
    fn address_parts(&mut self, index: &UOp) -> Result<Result<(Value, i32), Variable>, JitError> {
        if let Some(var) = self.register_of(index) {
            return Ok(Err(self.partial.iter().find(|(a, _)| *a == var).map_or(var, |(_, p)| *p)));
        }
        let size = index.dtype().size() as i64;
        let idx = &index.src()[1];
        // Copy k of an unrolled tile step: the address of copy 0 plus k strides.
        if let Some((range, k, first)) = &mut self.copy_addrs
            && let Some(&(addr, offset)) = first.get(index)
            && let Some((stride, _)) = split_linear(idx, range)
            && let Ok(offset) = i32::try_from(offset as i64 + *k * stride * size)
        {
            return Ok(Ok((addr, offset)));
        }
        let base = self.base_address(index)?;
        // A constant index stays whole: its value needs no other node.
        let split = split_constant_term(idx, size)
            .filter(|(x, _)| x.const_value().is_none())
            .filter(|(x, _)| self.vals.contains_key(x) || self.range_vars.contains_key(x));
        let (x, offset) = split.unwrap_or((idx.clone(), 0));
        let i = self.val(&x)?;
        let off = self.scale_index(i, size);
        let addr = self.b.ins().iadd(base, off);
        if let Some((_, 0, first)) = &mut self.copy_addrs {
            first.insert(index.clone(), (addr, offset));
        }
        Ok(Ok((addr, offset)))
    }

    /// `i * size` as a shift: x64 folds `base + (i << k)` into one addressing mode.
    fn scale_index(&mut self, i: Value, size: i64) -> Value {
        self.b.ins().ishl_imm_s(i, size.trailing_zeros() as i64)
    }

    fn stmt(&mut self, u: &UOp) -> Result<(), JitError> {
        let v = match u.op() {
            Op::Load => match self.address_parts(&u.src()[0])? {
                Ok((addr, offset)) => self.b.ins().load(clif_type(u.dtype()), mem(), addr, offset),
                Err(var) => self.b.use_var(var),
            },
            Op::Store => {
                let x = self.val(&u.src()[1])?;
                match self.address_parts(&u.src()[0])? {
                    Ok((addr, offset)) => {
                        self.b.ins().store(mem(), x, addr, offset);
                    }
                    Err(var) => {
                        self.tile_results.remove(&var.as_u32());
                        self.b.def_var(var, x)
                    }
                }
                return Ok(());
            }
            Op::Unary(op) => self.unary(*op, u)?,
            // Emitted inside its ADD as an fma.
            Op::Binary(BinaryOp::Mul) if self.contracted.contains(u) => return Ok(()),
            Op::Binary(BinaryOp::Add) if u.src().iter().any(|s| self.contracted.contains(s)) => {
                let (m, other) = if self.contracted.contains(&u.src()[0]) {
                    (&u.src()[0], &u.src()[1])
                } else {
                    (&u.src()[1], &u.src()[0])
                };
                let (a, b) = (self.val(&m.src()[0])?, self.val(&m.src()[1])?);
                let c = self.val(other)?;
                self.b.ins().fma(a, b, c)
            }
            Op::Binary(op) => self.binary(*op, u)?,
            Op::Where => {
                let c = self.val(&u.src()[0])?;
                let a = self.val(&u.src()[1])?;
                let b = self.val(&u.src()[2])?;
                self.b.ins().select(c, a, b)
            }
            Op::Cast => self.cast(u)?,
            Op::Index | Op::After | Op::End | Op::Sink => return Ok(()),
            Op::Tile(t) => return self.tile_call(u, *t),
            other => return Err(JitError::Internal(format!("cannot lower {}", other.name()))),
        };
        self.vals.insert(u.clone(), v);
        Ok(())
    }

    /// A tile op: one call into the micro-kernels of `uopc-tile` with each operand's address
    /// (the verifier proved every operand's whole block in bounds).
    fn tile_call(&mut self, u: &UOp, t: TileOp) -> Result<(), JitError> {
        let mut args = Vec::new();
        for x in u.src() {
            match self.address(x)? {
                Ok(addr) => args.push(addr),
                Err(_) => {
                    return Err(JitError::Internal(format!("{}: tile operand in registers", u.short())));
                }
            }
        }
        let mut int = |v: i64| self.b.ins().iconst(types::I64, v);
        let f = match t {
            TileOp::Gemm(shape) => {
                // The flat entry point takes the C descriptor's fields, in its order.
                let g = uopc_tile::GemmDesc::from(&shape);
                for v in [g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.flags] {
                    args.push(int(v));
                }
                self.externs.tile_gemm
            }
            TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo } => {
                for v in [rows, cols, lds, ldo, d] {
                    args.push(int(v as i64));
                }
                self.externs.tile_softmax
            }
        };
        // The status is always 0: every argument the kernel checks was checked at compile time.
        self.b.ins().call(f, &args);
        Ok(())
    }

    fn unary(&mut self, op: UnaryOp, u: &UOp) -> Result<Value, JitError> {
        let x = self.val(&u.src()[0])?;
        let d = u.dtype();
        Ok(match (op, d) {
            (UnaryOp::Neg, d) if d.is_float() => self.b.ins().fneg(x),
            (UnaryOp::Neg, _) => self.b.ins().ineg(x),
            (UnaryOp::Sqrt, _) => self.b.ins().sqrt(x),
            (UnaryOp::Recip, DType::F32) => {
                let one = self.b.ins().f32const(1.0);
                self.b.ins().fdiv(one, x)
            }
            (UnaryOp::Recip, _) => {
                let one = self.b.ins().f64const(1.0);
                self.b.ins().fdiv(one, x)
            }
            (UnaryOp::Exp2, DType::F32) => self.exp2_f32(x),
            (UnaryOp::Exp2, _) => self.call(self.externs.exp2_f64, x),
            (UnaryOp::Log2, DType::F32) => self.call(self.externs.log2_f32, x),
            (UnaryOp::Log2, _) => self.call(self.externs.log2_f64, x),
        })
    }

    fn call(&mut self, f: FuncRef, x: Value) -> Value {
        let inst = self.b.ins().call(f, &[x]);
        self.b.inst_results(inst)[0]
    }

    fn mul_add(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.use_fma {
            self.b.ins().fma(a, b, c)
        } else {
            let m = self.b.ins().fmul(a, b);
            self.b.ins().fadd(m, c)
        }
    }

    /// `2^x` inline: round-to-nearest split `x = n + f`, a degree-6 polynomial for `2^f` on
    /// [-0.5, 0.5], and `2^n` built in the exponent bits. `x <= -127` (including -inf) gives 0.
    fn exp2_f32(&mut self, x: Value) -> Value {
        // Works on f32 and on F32X4 lanes alike: 2^x = 2^n * 2^f with n = round(x) and
        // f in [-0.5, 0.5]; 2^f is a polynomial and 2^n is added straight into its exponent
        // bits. That add stays in the normal range for every clamped x but the very bottom:
        // x = 128 gives inf (2^128 overflows f32); 127.5 <= x < 128 has f < 0, so 2^f < 1
        // and the exponent field ends at 254 (finite); x <= -127 gives 0 and the half-unit
        // just above it tiny subnormal-sized values, like flushing below 2^-126.5.
        let ty = self.b.func.dfg.value_type(x);
        let lo = self.fconst(ty, -127.0);
        let hi = self.fconst(ty, 128.0);
        // (x < lo) ? lo : x and (hi < x) ? hi : x keep NaN as NaN (the comparisons are false);
        // both spelled with LessThan, the form x64 lowers to one maxps / minps on vectors.
        let x = self.fselect(FloatCC::LessThan, x, lo, lo, x);
        let x = self.fselect(FloatCC::LessThan, hi, x, hi, x);
        let magic = self.fconst(ty, 12582912.0); // 1.5 * 2^23: adding it rounds to an integer
        let t = self.b.ins().fadd(x, magic);
        let n = self.b.ins().fsub(t, magic);
        let f = self.b.ins().fsub(x, n);
        // Cephes exp2f coefficients as published.
        #[allow(clippy::excessive_precision)]
        const P: [f32; 6] =
            [1.535_336_2e-4, 1.339_887_4e-3, 9.618_437_4e-3, 5.550_332_5e-2, 2.402_264_8e-1, 6.931_472e-1];
        let mut p = self.fconst(ty, P[0]);
        for c in &P[1..] {
            let cv = self.fconst(ty, *c);
            p = self.mul_add(p, f, cv);
        }
        let one = self.fconst(ty, 1.0);
        let poly = self.mul_add(p, f, one);
        let ity = if ty.is_vector() { types::I32X4 } else { types::I32 };
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        // The low mantissa bits of t hold n in two's complement; shifting them to the
        // exponent field drops the magic constant's bits off the top.
        let t_bits = self.b.ins().bitcast(ity, flags, t);
        let sh = self.b.ins().iconst(types::I32, 23);
        let n_exponent = self.b.ins().ishl(t_bits, sh);
        let poly_bits = self.b.ins().bitcast(ity, flags, poly);
        let scaled = self.b.ins().iadd(poly_bits, n_exponent);
        self.b.ins().bitcast(ty, flags, scaled)
    }

    /// `(a > b) ? a : b` (the interpreter's MAX, NaN and signed zeros included), spelled
    /// `(b < a) ? a : b`: the form x64 lowers to one maxss / maxps instead of a branch.
    pub(super) fn fmax(&mut self, a: Value, b: Value) -> Value {
        self.fselect(FloatCC::LessThan, b, a, a, b)
    }

    /// An f32 constant, splatted when `ty` is a vector type.
    fn fconst(&mut self, ty: Type, v: f32) -> Value {
        let c = self.b.ins().f32const(v);
        if ty.is_vector() { self.b.ins().splat(ty, c) } else { c }
    }

    fn binary(&mut self, op: BinaryOp, u: &UOp) -> Result<Value, JitError> {
        let (sa, sb) = (&u.src()[0], &u.src()[1]);
        let d = sa.dtype();
        let a = self.val(sa)?;
        if d.is_float() {
            let b = self.val(sb)?;
            return Ok(match op {
                BinaryOp::Add => self.b.ins().fadd(a, b),
                BinaryOp::Sub => self.b.ins().fsub(a, b),
                BinaryOp::Mul => self.b.ins().fmul(a, b),
                BinaryOp::Max => self.fmax(a, b),
                BinaryOp::CmpLt => self.b.ins().fcmp(FloatCC::LessThan, a, b),
                BinaryOp::CmpNe => self.b.ins().fcmp(FloatCC::NotEqual, a, b),
                BinaryOp::IDiv | BinaryOp::Mod => {
                    return Err(JitError::Internal(format!("{} on floats", u.short())));
                }
            });
        }
        // Integer division by a constant: shifts and masks for non-negative dividends and powers
        // of two, a plain sdiv otherwise; variable divisors are guarded so nothing can trap.
        // The divisor as the machine sees it (wrapped to the operand width).
        let divisor = sb.const_value().map(|c| c.cast(d).as_i64());
        if let (BinaryOp::IDiv | BinaryOp::Mod, Some(c)) = (op, divisor)
            && c != 0
            && c != -1
        {
            if c > 0 && (c as u64).is_power_of_two() && sa.vmin() >= 0 {
                let sh = c.trailing_zeros() as i64;
                return Ok(if op == BinaryOp::IDiv {
                    self.b.ins().ushr_imm_s(a, sh)
                } else {
                    self.b.ins().band_imm_s(a, c - 1)
                });
            }
            let b = self.val(sb)?;
            return Ok(if op == BinaryOp::IDiv { self.b.ins().sdiv(a, b) } else { self.b.ins().srem(a, b) });
        }
        let b = self.val(sb)?;
        Ok(match op {
            BinaryOp::Add => self.b.ins().iadd(a, b),
            BinaryOp::Sub => self.b.ins().isub(a, b),
            BinaryOp::Mul => self.b.ins().imul(a, b),
            BinaryOp::Max => self.b.ins().smax(a, b),
            BinaryOp::CmpLt => self.b.ins().icmp(IntCC::SignedLessThan, a, b),
            BinaryOp::CmpNe => self.b.ins().icmp(IntCC::NotEqual, a, b),
            BinaryOp::IDiv | BinaryOp::Mod => {
                let ty = clif_type(d);
                let zero = self.b.ins().iconst(ty, 0);
                let one = self.b.ins().iconst(ty, 1);
                let is_zero = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let is_m1 = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let special = self.b.ins().bor(is_zero, is_m1);
                let safe = self.b.ins().select(special, one, b);
                if op == BinaryOp::IDiv {
                    let q = self.b.ins().sdiv(a, safe);
                    let neg = self.b.ins().ineg(a);
                    let q = self.b.ins().select(is_m1, neg, q);
                    self.b.ins().select(is_zero, zero, q)
                } else {
                    let r = self.b.ins().srem(a, safe);
                    self.b.ins().select(special, zero, r)
                }
            }
        })
    }

    fn cast(&mut self, u: &UOp) -> Result<Value, JitError> {
        let from = u.src()[0].dtype();
        let to = u.dtype();
        let x = self.val(&u.src()[0])?;
        let (tf, tt) = (clif_type(from), clif_type(to));
        Ok(match (from, to) {
            _ if from == to => x,
            (DType::F32, DType::F64) => self.b.ins().fpromote(types::F64, x),
            (DType::F64, DType::F32) => self.b.ins().fdemote(types::F32, x),
            (f, DType::Bool) if f.is_float() => {
                let z = if f == DType::F32 { self.b.ins().f32const(0.0) } else { self.b.ins().f64const(0.0) };
                self.b.ins().fcmp(FloatCC::NotEqual, x, z)
            }
            (_, DType::Bool) => self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0),
            (f, t) if f.is_float() => self.b.ins().fcvt_to_sint_sat(clif_type(t), x),
            (DType::Bool, t) if t.is_float() => {
                let w = self.b.ins().uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(tt, w)
            }
            (_, t) if t.is_float() => self.b.ins().fcvt_from_sint(tt, x),
            (DType::Bool, _) => self.b.ins().uextend(tt, x),
            _ if tf.bits() < tt.bits() => self.b.ins().sextend(tt, x),
            _ => self.b.ins().ireduce(tt, x),
        })
    }
}
