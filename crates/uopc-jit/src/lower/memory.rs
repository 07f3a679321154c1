//! Addresses: buffer and stack-slot elements, register ALLOCs, and constant terms folded into
//! the memory op's immediate offset.

use super::*;

/// `e` as `x + c` with a constant `c` (`x` = 0 when `e` is a constant), and `c * size` as a
/// byte offset when it fits a memory op's immediate.
pub(crate) fn split_constant_term(e: &UOp, size: i64) -> Option<(UOp, i32)> {
    let bytes = |c: i64| i32::try_from(c.checked_mul(size)?).ok();
    match (e.as_binary(), e.const_int()) {
        (_, Some(c)) => Some((uopc_ir::idx(0), bytes(c)?)),
        (Some((BinaryOp::Add, x, c)), None) => Some((x.clone(), bytes(c.const_int()?)?)),
        _ => None,
    }
}

pub(super) fn mem() -> MemFlagsData {
    // In bounds (proven by the verifier) and naturally aligned (slices of the element type).
    MemFlagsData::trusted()
}

impl Lowerer<'_, '_> {
    pub(super) fn register_of(&self, index: &UOp) -> Option<Variable> {
        let view = index.as_index()?;
        match self.storage.get(view_base(view.base)?) {
            Some(Storage::Vars(vars)) => vars.get(view.offset.const_int()? as usize).copied(),
            _ => None,
        }
    }

    /// The address of element 0 of the BUFFER or stack array an INDEX goes into.
    pub(super) fn base_address(&mut self, index: &UOp) -> Result<Value, JitError> {
        let base = index.indexed_base().ok_or_else(|| JitError::Internal("INDEX without base".into()))?;
        if let Some(p) = self.buf_ptrs.get(base).copied() {
            return Ok(p);
        }
        match self.storage.get(base) {
            Some(Storage::Slot(slot)) => {
                let slot = *slot;
                if let Some(&a) = self.slot_addrs.get(&slot) {
                    return Ok(a);
                }
                let mut a = self.b.ins().stack_addr(types::I64, slot, 0);
                if self.line_aligned_slots.contains(&slot) {
                    // The slot has a line's room more than its elements (`alloc_bytes`).
                    let line = uopc_ir::analysis::ALLOC_LINE_BYTES as i64;
                    let up = self.b.ins().iadd_imm_s(a, line - 1);
                    a = self.b.ins().band_imm_s(up, -line);
                }
                self.slot_addrs.insert(slot, a);
                Ok(a)
            }
            _ => Err(JitError::Internal(format!("{} has no memory", base.short()))),
        }
    }

    /// `base + i * 4`: the address of f32 (or i32) element `i`.
    pub(super) fn element_address(&mut self, base: Value, i: Value) -> Value {
        let off = self.scale_index(i, 4);
        self.b.ins().iadd(base, off)
    }

    /// The address of a BUFFER or stack-slot element, or the variable of a register ALLOC.
    pub(super) fn address(&mut self, index: &UOp) -> Result<Result<Value, Variable>, JitError> {
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
    pub(super) fn address_parts(&mut self, index: &UOp) -> Result<Result<(Value, i32), Variable>, JitError> {
        if let Some(var) = self.register_of(index) {
            return Ok(Err(self.partial.iter().find(|(a, _)| *a == var).map_or(var, |(_, p)| *p)));
        }
        let size = index.dtype().size() as i64;
        let idx = index.as_index().ok_or_else(|| malformed(index))?.offset;
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
    pub(super) fn scale_index(&mut self, i: Value, size: i64) -> Value {
        self.b.ins().ishl_imm_s(i, size.trailing_zeros() as i64)
    }
}
