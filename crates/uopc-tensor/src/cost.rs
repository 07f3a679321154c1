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
