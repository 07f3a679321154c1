//! Maps GEMM-shaped kernels onto the IR's tile GEMM (the CPU's "tensor core"): a kernel whose
//! body is `sum_k A[i, k] * B[k, j]` over two strided views of input buffers becomes one
//! `TILE_GEMM` per block of output rows instead of a loop nest, the way a GPU compiler lowers a
//! score tile to its matrix unit.

use crate::util::largest_divisor_at_most;
use crate::view::view_offset;
use uopc_ir::{AxisType, DType, GemmShape, Op, ReduceOp, TileOp, UOp, buffer, range, sink, tile};

/// Output rows per THREAD iteration: every call packs all of B once, so fewer, larger calls
/// pay less packing, while 256 rows still leave several tasks per thread for a 1024-row GEMM.
const ROWS_PER_TASK: usize = 256;

/// A view of a `Param` as `base + i*s0 + j*s1 + k*s2` over the `[m, n, k]` iteration space.
struct Affine {
    slot: usize,
    len: usize,
    base: usize,
    strides: [usize; 3],
}

/// The affine form of `v`, if its offsets are affine (checked at the corners and a few
/// interior points of the `shape` box).
fn affine(v: &UOp, shape: &[usize; 3]) -> Option<Affine> {
    let mut p = v.clone();
    while p.op().is_movement() {
        p = p.src()[0].clone();
    }
    let Op::Param { slot, shape: pshape } = p.op() else { return None };
    if v.dtype() != DType::F32 || v.shape() != shape.as_slice() {
        return None;
    }
    let at = |i: usize, j: usize, k: usize| view_offset(v, vec![i, j, k]);
    let base = at(0, 0, 0)?;
    let step = |axis: usize| -> Option<usize> {
        if shape[axis] < 2 {
            return Some(0);
        }
        let mut idx = [0usize; 3];
        idx[axis] = 1;
        at(idx[0], idx[1], idx[2])?.checked_sub(base)
    };
    let strides = [step(0)?, step(1)?, step(2)?];
    let [m, n, k] = *shape;
    let probes = [(m - 1, n - 1, k - 1), (m / 2, n / 3, k / 2), (m - 1, 0, k / 3), (0, n - 1, k - 1)];
    for (i, j, l) in probes {
        if at(i, j, l)? != base + i * strides[0] + j * strides[1] + l * strides[2] {
            return None;
        }
    }
    Some(Affine { slot: *slot, len: pshape.iter().product::<usize>().max(1), base, strides })
}

/// `Some((transposed, leading dimension))` when a `rows x cols` operand with strides
/// `(along rows, along cols)` is row-major (unit column stride) or transposed (unit row stride).
fn layout(rows: usize, cols: usize, s_row: usize, s_col: usize) -> Option<(bool, usize)> {
    if (s_col == 1 || cols == 1) && (rows == 1 || s_row >= cols) {
        Some((false, if rows == 1 { cols } else { s_row }))
    } else if (s_row == 1 || rows == 1) && (cols == 1 || s_col >= rows) {
        Some((true, if cols == 1 { rows } else { s_col }))
    } else {
        None
    }
}

/// The loop program of a GEMM-shaped kernel `body` writing `out`, or `None` when the body is
/// anything else (then it is rangeified as usual).
pub(crate) fn lower_gemm(body: &UOp, out: &UOp) -> Option<UOp> {
    let Op::Reduce { op: ReduceOp::Add, axes: 1 } = body.op() else { return None };
    let x = &body.src()[0];
    let &[m, n, k] = x.shape() else { return None };
    let Some((uopc_ir::BinaryOp::Mul, lhs, rhs)) = x.as_binary() else { return None };
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    let shape = [m, n, k];
    let (p, q) = (affine(lhs, &shape)?, affine(rhs, &shape)?);
    // A is broadcast along the output columns, B along the output rows.
    let (a, b) = match (p.strides[1], q.strides[0]) {
        (0, 0) => (p, q),
        _ if q.strides[1] == 0 && p.strides[0] == 0 => (q, p),
        _ => return None,
    };
    let (a_trans, lda) = layout(m, k, a.strides[0], a.strides[2])?;
    let (b_trans, ldb) = layout(k, n, b.strides[2], b.strides[1])?;
    let rows = largest_divisor_at_most(m, ROWS_PER_TASK);
    let op = TileOp::Gemm(GemmShape { m: rows, n, k, lda, ldb, ldc: n, a_trans, b_trans, accumulate: false });
    let abuf = buffer(a.slot, DType::F32, a.len);
    let bbuf = buffer(b.slot, DType::F32, b.len);
    let t = range(m / rows, 0, AxisType::Thread);
    let a_start = &t * (rows * a.strides[0]) + a.base as i64;
    let g = tile(op, &[abuf.index(a_start), bbuf.index(b.base as i64), out.index(&t * (rows * n))]);
    Some(sink(&[sink(&[g]).end(&[t])]))
}
