//! Static cost of a loop program, counted from its loop structure.

use uopc_ir::{IrError, Op, Stmt, UOp, linearize};

/// Floating-point ALU operations one run of `program` executes: every float ALU op (and float
/// comparison) times the trip counts of the loops around it, and each tile op's FLOPs. Index
/// arithmetic is not counted.
///
/// # Errors
///
/// The [`IrError`] of linearizing `program` when it is not a well-formed loop program.
pub fn static_flops(program: &UOp) -> Result<u64, IrError> {
    let lin = linearize(program)?;
    fn go(body: &[Stmt], mult: u64) -> u64 {
        body.iter()
            .map(|s| match s {
                Stmt::Loop { range, body } => {
                    let end = range.as_range().expect("a loop's range").end;
                    let trip = end.const_int().unwrap_or(end.vmax().max(0) + 1);
                    go(body, mult * trip.max(0) as u64)
                }
                Stmt::Op(u) => {
                    if let Op::Tile(t) = u.op() {
                        return mult * t.flops();
                    }
                    let float = u.dtype().is_float() || u.src().first().is_some_and(|s| s.dtype().is_float());
                    if u.op().is_alu() && !matches!(u.op(), Op::Cast) && float { mult } else { 0 }
                }
            })
            .sum()
    }
    Ok(go(&lin.root, 1))
}

/// Products of an element of input `a` by an element of input `b` one run of `plan` executes:
/// MULs of a load of one by a load of the other, and `m n k` per tile GEMM of a block of one
/// by a block of the other, each times the trip counts of the loops around it. For attention
/// with Q and K as inputs 0 and 1, `n_q n_k d` means each q.k product is computed once.
///
/// # Errors
///
/// The [`IrError`] of linearizing a kernel's program when it is not a well-formed loop program.
pub fn input_products(plan: &crate::Plan, a: usize, b: usize) -> Result<u64, IrError> {
    fn slot(index: &UOp) -> Option<usize> {
        match uopc_ir::view_base(index.as_index()?.base)?.op() {
            Op::Buffer { slot, .. } => Some(slot.index()),
            _ => None,
        }
    }
    fn go(body: &[Stmt], mult: u64, pair: &dyn Fn([Option<usize>; 2]) -> bool) -> u64 {
        let load_slot = |u: &UOp| u.as_load().and_then(slot);
        body.iter()
            .map(|s| match s {
                Stmt::Loop { range, body } => {
                    let trip = range.as_range().and_then(|r| r.end.const_int()).unwrap_or(0).max(0) as u64;
                    go(body, mult * trip, pair)
                }
                Stmt::Op(u) => match u.op() {
                    Op::Binary(uopc_ir::BinaryOp::Mul)
                        if u.as_binary().is_some_and(|(_, a, b)| pair([load_slot(a), load_slot(b)])) =>
                    {
                        mult
                    }
                    Op::Tile(uopc_ir::TileOp::Gemm(_))
                        if u.as_gemm().is_some_and(|g| pair([slot(g.a), slot(g.b)])) =>
                    {
                        u.as_gemm().map_or(0, |g| mult * (g.shape.m * g.shape.n * g.shape.k) as u64)
                    }
                    _ => 0,
                },
            })
            .sum()
    }
    let mut total = 0;
    for kernel in &plan.kernels {
        let pos = |x| kernel.read().iter().position(|y| *y == crate::ArgSource::Input(x));
        if let (Some(pa), Some(pb)) = (pos(a), pos(b)) {
            let pair = move |s: [Option<usize>; 2]| s == [Some(pa), Some(pb)] || s == [Some(pb), Some(pa)];
            total += go(&linearize(&kernel.program)?.root, 1, &pair);
        }
    }
    Ok(total)
}
