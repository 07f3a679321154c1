//! Random structural damage to valid programs: the inputs a compiler must reject cleanly.

use crate::rng::Rng;
use std::collections::HashMap;
use uopc_ir::alu::{BINARY_OPS, UNARY_OPS};
use uopc_ir::{AxisType, ConstValue, DType, Op, RangeId, ReduceOp, UOp, idx};

const DTYPES: [DType; 5] = [DType::Bool, DType::I32, DType::I64, DType::F32, DType::F64];

/// `program` with `n` random mutations (each rebuilds the graph above the changed node).
pub fn mutate(program: &UOp, rng: &mut Rng, n: usize) -> UOp {
    let mut p = program.clone();
    for _ in 0..n {
        p = mutate_once(&p, rng);
    }
    p
}

fn mutate_once(program: &UOp, rng: &mut Rng) -> UOp {
    let topo = UOp::toposort(std::slice::from_ref(program));
    let target = rng.pick(&topo);
    let other = rng.pick(&topo);
    let src = target.src().to_vec();
    let (op, d) = (target.op().clone(), target.dtype());
    let replacement = match rng.below(12) {
        // Swap two sources.
        0 if src.len() >= 2 => {
            let (a, b) = (rng.below(src.len() as u64) as usize, rng.below(src.len() as u64) as usize);
            let mut s = src.clone();
            s.swap(a, b);
            UOp::new(op, d, s)
        }
        // A source replaced by an arbitrary node of the program.
        1 if !src.is_empty() => {
            let mut s = src.clone();
            let k = rng.below(s.len() as u64) as usize;
            s[k] = other;
            UOp::new(op, d, s)
        }
        // Drop an END (or any node with sources) in favour of its first source.
        2 if !src.is_empty() => src[0].clone(),
        // Another dtype.
        3 => UOp::new(op, rng.pick(&DTYPES), src),
        // Another buffer or alloc length or slot.
        4 => other_length(op, d, src, rng),
        // An index outside the buffer.
        5 if matches!(op, Op::Index) && src.len() == 2 => {
            let k = rng.pick(&[-1, 1 << 20, i64::MAX, i64::MIN, 7]);
            UOp::new(op, d, vec![src[0].clone(), idx(k)])
        }
        // Range ends and axes.
        6 => other_range(op, d, src, rng),
        // Another op of the same kind (or any op at all).
        7 => other_op(op, d, src, rng),
        // One source fewer or more.
        8 => {
            let mut s = src.clone();
            if rng.chance(50) && !s.is_empty() {
                s.remove(rng.below(s.len() as u64) as usize);
            } else {
                s.push(other);
            }
            UOp::new(op, d, s)
        }
        // Another constant.
        9 => other_const(op, d, src, rng),
        // AFTER without its dependencies.
        10 if matches!(op, Op::After) && !src.is_empty() => UOp::new(op, d, vec![src[0].clone()]),
        _ => UOp::new(op, d, src),
    };
    replace(program, &topo, &target, &replacement)
}

/// `op` with another length or slot when it is a BUFFER or ALLOC.
fn other_length(op: Op, d: DType, src: Vec<UOp>, rng: &mut Rng) -> UOp {
    let slot_len = match op {
        Op::Buffer { slot, len } => Some((slot.index(), len)),
        Op::Alloc { slot, len } => Some((slot.index(), len)),
        _ => None,
    };
    match slot_len {
        Some((slot, len)) => {
            let len2 = rng.pick(&[0, len.saturating_sub(1), len + 1, len * 2, 1 << 40, usize::MAX]);
            let slot2 = if rng.chance(30) { slot + rng.below(3) as usize } else { slot };
            let new = if matches!(op, Op::Buffer { .. }) {
                Op::Buffer { slot: slot2.into(), len: len2 }
            } else {
                Op::Alloc { slot: slot2.into(), len: len2 }
            };
            UOp::new(new, d, src)
        }
        None => UOp::new(op, d, src),
    }
}

/// `op` with another end, axis or id when it is a RANGE.
fn other_range(op: Op, d: DType, src: Vec<UOp>, rng: &mut Rng) -> UOp {
    match op {
        Op::Range { id, .. } => {
            let axis = rng.pick(&[
                AxisType::Thread,
                AxisType::Loop,
                AxisType::Reduce,
                AxisType::Upcast,
                AxisType::Unroll,
            ]);
            let end = if rng.chance(50) {
                idx(rng.pick(&[-1, 0, 1, 1 << 40, i64::MAX, i64::MIN]))
            } else {
                src.first().cloned().unwrap_or_else(|| idx(3))
            };
            let id2 = if rng.chance(20) { RangeId::new(id.index() + 1) } else { id };
            UOp::new(Op::Range { id: id2, axis }, d, vec![end])
        }
        _ => UOp::new(op, d, src),
    }
}

/// Another op of the same kind as `op` (or, outside ALU ops, any op at all).
fn other_op(op: Op, d: DType, src: Vec<UOp>, rng: &mut Rng) -> UOp {
    let new = match op {
        Op::Binary(_) => Op::Binary(rng.pick(&BINARY_OPS)),
        Op::Unary(_) => Op::Unary(rng.pick(&UNARY_OPS)),
        _ => rng.pick(&[
            Op::Load,
            Op::Store,
            Op::Index,
            Op::After,
            Op::End,
            Op::Sink,
            Op::Where,
            Op::Cast,
            Op::Stage,
            Op::Reduce { op: ReduceOp::Add, axes: 1 },
            Op::Reshape(vec![2, 3]),
            Op::Param { slot: 0, shape: vec![4] },
        ]),
    };
    UOp::new(new, d, src)
}

/// `op` with another constant when it is a CONST.
fn other_const(op: Op, d: DType, src: Vec<UOp>, rng: &mut Rng) -> UOp {
    match op {
        Op::Const(_) => {
            let c = rng.pick(&[
                ConstValue::Int(-1),
                ConstValue::Int(i64::MAX),
                ConstValue::Int(i64::MIN),
                ConstValue::Int(1 << 33),
                ConstValue::float(f64::NAN),
                ConstValue::float(1e300),
                ConstValue::Bool(true),
                ConstValue::Int(0),
            ]);
            UOp::new(Op::Const(c), d, src)
        }
        _ => UOp::new(op, d, src),
    }
}

/// Rebuilds `program` with `old` replaced by `new` wherever it is used.
fn replace(program: &UOp, topo: &[UOp], old: &UOp, new: &UOp) -> UOp {
    let mut map: HashMap<UOp, UOp> = HashMap::with_capacity(topo.len());
    for u in topo {
        let v = if u == old {
            new.clone()
        } else {
            let src: Vec<UOp> =
                u.src().iter().map(|s| map.get(s).cloned().unwrap_or_else(|| s.clone())).collect();
            u.with_src(src)
        };
        map.insert(u.clone(), v);
    }
    map.get(program).cloned().unwrap_or_else(|| program.clone())
}
