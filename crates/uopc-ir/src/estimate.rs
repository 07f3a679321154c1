//! Static cost estimates counted from the loop structure.

use crate::linearize::{Linear, Stmt};
use crate::uop::{Op, UOp};

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
    let end = range.as_range().expect("a RANGE").end;
    match end.const_int() {
        Some(n) => n.max(0) as f64,
        // A ragged loop (end depends on an enclosing range) or one ending at a variable: its
        // average trip count, assuming the end varies linearly between its bounds.
        None => ((end.vmin().max(0) + end.vmax().max(0)) as f64) / 2.0,
    }
}

/// The work `lin` does per run: FLOPs and bytes counted statically, each statement once per
/// trip of its enclosing loops (a loop whose end depends on an enclosing range counts its
/// average trip count). A tile op counts its own FLOPs and the extent of every BUFFER operand.
pub fn estimate(lin: &Linear) -> Estimates {
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
                            if let Some(b) = x.indexed_base()
                                && matches!(b.op(), Op::Buffer { .. })
                            {
                                *access += mult * (o.extent * b.dtype().size()) as f64;
                            }
                        }
                    }
                    if let Some(index) = u.memory_index()
                        && let Some(b) = index.indexed_base()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{buffer, range, sink};
    use crate::dtype::DType;
    use crate::linearize::linearize;
    use crate::uop::AxisType;

    #[test]
    fn counts_each_statement_once_per_trip() {
        // out[i] = a[i] * 2 + 1 over 8 elements: two FLOPs and two f32 accesses per trip.
        let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 8));
        let i = range(8, 0, AxisType::Loop);
        let program = sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32 + 1.0f32).end(&[i])]);
        let e = estimate(&linearize(&program).unwrap());
        assert_eq!(e, Estimates { flops: 16, bytes: 64, access_bytes: 64 });
    }

    #[test]
    fn a_ragged_loop_counts_its_average_trip_count() {
        // for i in 0..4 { for j in 0..i+1 { out[i] = out[i] + 1 } }: 1 + 2 + 3 + 4 = 10 adds,
        // counted as 4 trips of an average (1 + 4) / 2 = 2.5.
        let out = buffer(0, DType::F32, 4);
        let i = range(4, 0, AxisType::Loop);
        let j = range(&i + 1, 1, AxisType::Loop);
        let o = out.after(&[j.clone()]).index(&i);
        let program = sink(&[o.store(o.load() + 1.0f32).end(&[j, i])]);
        let e = estimate(&linearize(&program).unwrap());
        assert_eq!(e.flops, 10);
        assert_eq!(e.access_bytes, 80);
    }
}
