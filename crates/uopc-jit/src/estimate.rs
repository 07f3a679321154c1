//! Static cost estimates counted from the loop structure.

use uopc_ir::{Linear, Op, Stmt, UOp, view_base};

/// Work a program does per run, counted statically.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimates {
    /// Floating-point ALU operations (each op is one FLOP, EXP2 included; copies count zero).
    pub flops: u64,
    /// Bytes of BUFFER memory the program must move at least: every buffer it reads or writes,
    /// once.
    pub bytes: u64,
    /// Bytes of BUFFER loads and stores executed, counted per access.
    pub access_bytes: u64,
}

fn trip_count(range: &UOp) -> f64 {
    let end = &range.src()[0];
    match end.const_int() {
        Some(n) => n.max(0) as f64,
        // A ragged loop (end depends on an enclosing range): its average trip count, assuming
        // the end varies linearly between its bounds.
        None => ((end.vmin().max(0) + end.vmax().max(0)) as f64) / 2.0,
    }
}

pub(crate) fn estimate(lin: &Linear) -> Estimates {
    fn go(body: &[Stmt], mult: f64, flops: &mut f64, access: &mut f64) {
        for s in body {
            match s {
                Stmt::Loop { range, body } => go(body, mult * trip_count(range), flops, access),
                Stmt::Op(u) => {
                    let float_alu = u.op().is_alu()
                        && !matches!(u.op(), Op::Cast)
                        && u.src().iter().any(|s| s.dtype().is_float());
                    if float_alu {
                        *flops += mult;
                    }
                    if let Op::Tile(t) = u.op() {
                        *flops += mult * t.flops() as f64;
                        for (x, o) in u.src().iter().zip(t.operands()) {
                            if let Some(b) = view_base(&x.src()[0])
                                && matches!(b.op(), Op::Buffer { .. })
                            {
                                *access += mult * (o.extent * b.dtype().size()) as f64;
                            }
                        }
                    }
                    if let Op::Load | Op::Store = u.op()
                        && let Some(b) = view_base(&u.src()[0].src()[0])
                        && matches!(b.op(), Op::Buffer { .. })
                    {
                        *access += mult * b.dtype().size() as f64;
                    }
                }
            }
        }
    }
    let (mut flops, mut access) = (0.0, 0.0);
    go(&lin.root, 1.0, &mut flops, &mut access);
    let bytes = lin
        .buffers
        .iter()
        .map(|b| match b.op() {
            Op::Buffer { len, .. } => (len * b.dtype().size()) as u64,
            _ => 0,
        })
        .sum();
    Estimates { flops: flops as u64, bytes, access_bytes: access as u64 }
}
