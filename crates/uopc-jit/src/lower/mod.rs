//! Lowering of a prepared (linearized) loop program to Cranelift IR.
//!
//! The function signature is `(bufs: *const *mut u8, lo: i64, hi: i64, vars: *const i64)`:
//! buffer pointers by slot, the slice `lo..hi` of the THREAD range this call runs, and the
//! values of the program's variables by slot (each read once, in the entry block). Scalar accumulators become
//! `Variable`s (Cranelift builds the SSA), arrays indexed by a loop variable become stack slots.

use crate::JitError;
use crate::externs::{Extern, Externs};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    BlockArg, FuncRef, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type, Value, types,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use std::collections::HashMap;
use uopc_ir::{
    BinaryOp, ConstValue, DType, Op, PreparedKernel, Stmt, TileOp, UOp, UnaryOp, split_linear, view_base,
};

mod half;
mod loops;
mod memory;
mod packed_store;
mod scalar;
mod tile;
mod vector;
mod vector_plan;

use loops::{LoopTest, Trips, range_end};
use memory::{mem, split_constant_term};
use scalar::clif_type;

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

/// The error for a node whose sources are not those its op needs (the verifier rules that
/// out, so reaching it is a bug in an earlier stage).
fn malformed(u: &UOp) -> JitError {
    JitError::Internal(format!("{} with sources its op does not take", u.short()))
}

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
    /// Each VAR's value, loaded from `vars` in the entry block (so it dominates every use).
    var_vals: HashMap<UOp, Value>,
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
    /// Values widened from a 16-bit load: value -> (its dtype, the loaded encoding). Storing
    /// one back to the same dtype needs no rounding, only the NaN quieting the widening did.
    half_loaded: HashMap<Value, (DType, Value)>,
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
    /// Slots whose address is rounded up to a cache line (see `base_address`).
    line_aligned_slots: std::collections::HashSet<StackSlot>,
    /// While lowering the unrolled steps of a register tile: its range, the step being emitted,
    /// and step 0's addresses by INDEX (later steps add their offset to those).
    pub(crate) copy_addrs: Option<(UOp, i64, StepAddresses)>,
    /// While lowering one unrolled copy of a split reduction: accumulator -> its partial sum.
    partial: Vec<(Variable, Variable)>,
    bufs: Value,
    lo: Value,
    hi: Value,
    vars: Value,
}

impl<'a, 'b> Lowerer<'a, 'b> {
    pub fn new(
        b: &'a mut FunctionBuilder<'b>,
        externs: Externs,
        flags: Flags,
        bufs: Value,
        lo: Value,
        hi: Value,
        vars: Value,
    ) -> Self {
        Lowerer {
            b,
            vals: HashMap::new(),
            buf_ptrs: HashMap::new(),
            var_vals: HashMap::new(),
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
            line_aligned_slots: std::collections::HashSet::new(),
            copy_addrs: None,
            read_only: Default::default(),
            tile_results: HashMap::new(),
            half_loaded: HashMap::new(),
            contracted: Default::default(),
            bufs,
            lo,
            hi,
            vars,
        }
    }

    /// Declares buffers and local storage, then lowers every statement of `kernel`.
    pub fn lower(&mut self, kernel: &PreparedKernel) -> Result<(), JitError> {
        let lin = &kernel.linear;
        for buf in &lin.buffers {
            if let Op::Buffer { slot, .. } = buf.op() {
                let p = self.b.ins().load(types::I64, mem(), self.bufs, (slot.index() as i32) * 8);
                self.buf_ptrs.insert(buf.clone(), p);
            }
        }
        for v in &lin.vars {
            if let Op::Var { slot, .. } = v.op() {
                // Checked against the VAR's bounds by the runner before the call.
                let x = self.b.ins().load(
                    types::I64,
                    mem().with_readonly(),
                    self.vars,
                    (slot.index() as i32) * 8,
                );
                self.var_vals.insert(v.clone(), x);
            }
        }
        self.read_only = kernel.read_only.clone();
        if self.use_fma && self.contract {
            self.contracted = kernel.contractible_muls.clone();
        }
        for a in &lin.allocs {
            let Op::Alloc { len, .. } = a.op() else { continue };
            let ty = clif_type(a.dtype());
            // Small ALLOCs only ever indexed by constants live in registers.
            let st = if kernel.register_allocs.contains(a) {
                Storage::Vars((0..*len).map(|_| self.b.declare_var(ty)).collect())
            } else {
                let bytes = *len * a.dtype().size();
                let align = a.dtype().size().trailing_zeros() as u8;
                let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                    StackSlotKind::ExplicitSlot,
                    uopc_ir::analysis::alloc_bytes(bytes) as u32,
                    align,
                ));
                // Cranelift aligns a slot only to the frame's 16 bytes: a large one gets a
                // line's room more, and its start is aligned when its address is taken.
                if bytes >= uopc_ir::analysis::LINE_ALIGNED_ALLOC_MIN_BYTES {
                    self.line_aligned_slots.insert(slot);
                }
                Storage::Slot(slot)
            };
            self.storage.insert(a.clone(), st);
        }
        self.block(&lin.root)
    }

    fn block(&mut self, body: &[Stmt]) -> Result<(), JitError> {
        // Groups of scalar stores computed from a register tile's vectors: emitted as one
        // vector store at the last of each group, the rest skipped.
        let mut packed = packed_store::PackedStores::default();
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

    fn constant(&mut self, c: ConstValue, d: DType) -> Value {
        match d {
            DType::F32 => self.b.ins().f32const(c.as_f64() as f32),
            // The f32 that carries the 16-bit value (the constant rounded to `d` first).
            DType::BF16 | DType::F16 => self.b.ins().f32const(c.cast(d).as_f64() as f32),
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
        if let Some(&v) = self.var_vals.get(u) {
            return Ok(v);
        }
        self.vals
            .get(u)
            .copied()
            .ok_or_else(|| JitError::Internal(format!("{} used before it is computed", u.short())))
    }

    fn stmt(&mut self, u: &UOp) -> Result<(), JitError> {
        let v = match u.op() {
            Op::Load if let Some(index) = u.as_load() => match self.address_parts(index)? {
                Ok((addr, offset)) if u.dtype().is_half() => self.half_load(u.dtype(), addr, offset),
                Ok((addr, offset)) => self.b.ins().load(clif_type(u.dtype()), mem(), addr, offset),
                Err(var) => self.b.use_var(var),
            },
            Op::Store if let Some(s) = u.as_store() => {
                let x = self.val(s.value)?;
                match self.address_parts(s.index)? {
                    Ok((addr, offset)) if s.value.dtype().is_half() => {
                        self.half_store(s.value.dtype(), x, addr, offset);
                    }
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
                let (_, x, y) = u.as_binary().ok_or_else(|| malformed(u))?;
                let (m, other) = if self.contracted.contains(x) { (x, y) } else { (y, x) };
                let (_, ma, mb) = m.as_binary().ok_or_else(|| malformed(m))?;
                let (a, b) = (self.val(ma)?, self.val(mb)?);
                let c = self.val(other)?;
                self.b.ins().fma(a, b, c)
            }
            Op::Binary(op) => self.binary(*op, u)?,
            Op::Where if let Some(w) = u.as_where() => {
                let c = self.val(w.cond)?;
                let a = self.val(w.then)?;
                let b = self.val(w.otherwise)?;
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
        // The operand dtypes pick the kernel where the op has several (the verifier allowed
        // only the pairs uopc_tile has entries for).
        let elems: Vec<_> = u.src().iter().map(|x| x.dtype().tile_elem()).collect();
        let call = t.call(&elems);
        args.truncate(call.operands);
        for v in call.fields {
            args.push(self.b.ins().iconst(types::I64, v));
        }
        let f = self.externs.get(Extern::Tile(call.entry));
        // The status is always 0: every argument the kernel checks was checked at compile time.
        self.b.ins().call(f, &args);
        Ok(())
    }
}
