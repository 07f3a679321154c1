//! Maps GEMM-shaped kernels onto the IR's tile GEMM (the CPU's "tensor core"): a kernel whose
//! body is `sum_k A[i, k] * B[k, j]` over two strided views of input buffers becomes one
//! `TILE_GEMM` per block of output rows instead of a loop nest, the way a GPU compiler lowers a
//! score tile to its matrix unit.

use crate::gemm_grid;
use crate::util::largest_divisor_at_most;
use crate::view::{movement_chain, reapply, view_offset};
use uopc_ir::{AxisType, DType, GemmShape, Op, ReduceOp, TileOp, UOp, buffer, range, sink, tile};

/// A view of a `Param` as `base + sum_a idx[a] * strides[a]` over the `[batch.., m, n, k]`
/// iteration space.
pub(crate) struct Affine {
    pub(crate) slot: usize,
    /// The stored element type: f32, or bf16 / f16 widened to f32 by the view.
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) base: usize,
    pub(crate) strides: Vec<usize>,
}

/// The affine form of `v`, if its offsets are affine (checked at the corners and a few
/// interior points of the `shape` box).
pub(crate) fn affine(v: &UOp, shape: &[usize]) -> Option<Affine> {
    if v.dtype() != DType::F32 {
        return None;
    }
    let v = &without_widening(v);
    let mut p = v.clone();
    while let Some(viewed) = p.as_movement().cloned() {
        p = viewed;
    }
    let Op::Param { slot, shape: pshape } = p.op() else { return None };
    if v.shape() != shape {
        return None;
    }
    let r = shape.len();
    let at = |idx: &[usize]| view_offset(v, idx.to_vec());
    let base = at(&vec![0; r])?;
    let mut strides = Vec::with_capacity(r);
    for axis in 0..r {
        if shape[axis] < 2 {
            strides.push(0);
            continue;
        }
        let mut idx = vec![0; r];
        idx[axis] = 1;
        strides.push(at(&idx)?.checked_sub(base)?);
    }
    let probes: [Vec<usize>; 4] = [
        shape.iter().map(|&s| s - 1).collect(),
        shape.iter().enumerate().map(|(a, &s)| s / (2 + a % 2)).collect(),
        shape.iter().enumerate().map(|(a, &s)| if a % 2 == 0 { s - 1 } else { 0 }).collect(),
        shape.iter().enumerate().map(|(a, &s)| if a % 2 == 1 { s - 1 } else { s / 3 }).collect(),
    ];
    for idx in &probes {
        let want: usize = base + idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>();
        if at(idx)? != want {
            return None;
        }
    }
    Some(Affine {
        slot: *slot,
        dtype: p.dtype(),
        len: pshape.iter().product::<usize>().max(1),
        base,
        strides,
    })
}

/// `v` read from the 16-bit `Param` below it when `v` is movement ops over a widening CAST of
/// movement ops over one (a bf16 or f16 matmul's operand, perhaps transposed before the
/// widening), so the GEMM of that dtype reads the stored 16-bit values in place and widens
/// them itself; otherwise `v` unchanged.
fn without_widening(v: &UOp) -> UOp {
    let (chain, p) = movement_chain(v);
    let Some(stored) = p.as_cast().filter(|x| x.dtype().is_half()).cloned() else {
        return v.clone();
    };
    if !matches!(movement_chain(&stored).1.op(), Op::Param { .. }) {
        return v.clone();
    }
    reapply(&chain, stored)
}

/// `Some((transposed, leading dimension))` when a `rows x cols` operand with strides
/// `(along rows, along cols)` is row-major (unit column stride) or transposed (unit row stride).
pub(crate) fn layout(rows: usize, cols: usize, s_row: usize, s_col: usize) -> Option<(bool, usize)> {
    if (s_col == 1 || cols == 1) && (rows == 1 || s_row >= cols) {
        Some((false, if rows == 1 { cols } else { s_row }))
    } else if (s_row == 1 || rows == 1) && (cols == 1 || s_col >= rows) {
        Some((true, if cols == 1 { rows } else { s_col }))
    } else {
        None
    }
}

/// The offset of batch item `item` (a flat index over `batch`) in an operand with the given
/// batch strides: the item's coordinates by division and remainder, last axis fastest.
pub(crate) fn batch_offset(item: &UOp, batch: &[usize], strides: &[usize]) -> UOp {
    let mut offset = uopc_ir::idx(0);
    let mut rest = item.clone();
    for (&size, &stride) in batch.iter().zip(strides).rev() {
        if stride != 0 && size > 1 {
            offset = offset + rest.modulo(size as i64) * stride as i64;
        }
        rest = rest.idiv(size as i64);
    }
    offset
}

/// The two operands of a GEMM-shaped reduce, as the tile GEMM reads them in place.
pub(crate) struct Operands {
    /// The `[batch.., m, n, k]` product shape.
    pub(crate) shape: Vec<usize>,
    /// The operand broadcast along the output columns, with its layout.
    pub(crate) a: Affine,
    pub(crate) a_trans: bool,
    pub(crate) lda: usize,
    /// The operand broadcast along the output rows, with its layout.
    pub(crate) b: Affine,
    pub(crate) b_trans: bool,
    pub(crate) ldb: usize,
}

/// The operands of the product `x`, a MUL under any chain of movement ops, each as a view
/// through that chain: a movement op of a product is the product of the moved operands. A
/// gradient's sum over a broadcast axis permutes the product so the axis is last.
fn product_operands(x: &UOp) -> Option<(UOp, UOp)> {
    let (chain, p) = movement_chain(x);
    let Some((uopc_ir::BinaryOp::Mul, lhs, rhs)) = p.as_binary() else { return None };
    Some((reapply(&chain, lhs.clone()), reapply(&chain, rhs.clone())))
}

/// The operands of `body` when it is `sum_k A[.., i, k] * B[.., k, j]` over two row-major or
/// transposed f32 views of `Param`s (or of bf16 or f16 `Param`s widened to f32, both or one
/// of them): the shape a tile GEMM computes without copying either.
pub(crate) fn gemm_operands(body: &UOp) -> Option<Operands> {
    let x = body.as_reduce().filter(|r| (r.op, r.axes) == (ReduceOp::Add, 1))?.input;
    let shape = x.shape().to_vec();
    let r = shape.len();
    if r < 3 || shape.contains(&0) {
        return None;
    }
    let [m, n, k] = [shape[r - 3], shape[r - 2], shape[r - 1]];
    let (lhs, rhs) = product_operands(x)?;
    let (p, q) = (affine(&lhs, &shape)?, affine(&rhs, &shape)?);
    let (im, in_, ik) = (r - 3, r - 2, r - 1);
    // A is broadcast along the output columns, B along the output rows.
    let (a, b) = match (p.strides[in_], q.strides[im]) {
        (0, 0) => (p, q),
        _ if q.strides[in_] == 0 && p.strides[im] == 0 => (q, p),
        _ => return None,
    };
    // The pairs the tile library multiplies: both alike, or f32 with a 16-bit operand
    // (bf16 or f16 weights beside f32 activations), widened as it is read.
    if a.dtype != b.dtype && a.dtype.is_half() == b.dtype.is_half() {
        return None;
    }
    let (a_trans, lda) = layout(m, k, a.strides[im], a.strides[ik])?;
    let (b_trans, ldb) = layout(k, n, b.strides[ik], b.strides[in_])?;
    Some(Operands { shape, a, a_trans, lda, b, b_trans, ldb })
}

/// `ops` with its batch axes folded into the rows when that reads the same elements: B is
/// one matrix for every batch item (zero batch strides) and A's rows run on from one item to
/// the next (not transposed, each batch axis's stride the row stride times the rows of the
/// axes inside it), as in a linear layer applied to a `(batch, tokens, features)` input. The
/// output is contiguous, so its rows run on likewise. The product is then one GEMM of
/// `items * m` rows, cut by the grid like any other, instead of `items` GEMMs each packing
/// the same B again; otherwise `ops` unchanged.
fn batch_folded_into_rows(ops: Operands) -> Operands {
    let r = ops.shape.len();
    let (im, in_, ik) = (r - 3, r - 2, r - 1);
    let m = ops.shape[im];
    let folds = r > 3 && !ops.a_trans && {
        let mut run_on = m * ops.lda;
        (0..im).rev().all(|axis| {
            let size = ops.shape[axis];
            let ok = size < 2 || (ops.b.strides[axis] == 0 && ops.a.strides[axis] == run_on);
            run_on *= size;
            ok
        })
    };
    if !folds {
        return ops;
    }
    let rows = ops.shape[..in_].iter().product();
    let shape = vec![rows, ops.shape[in_], ops.shape[ik]];
    // The row stride is `lda` even where a single row's axis recorded none.
    let a_strides = vec![ops.lda, ops.a.strides[in_], ops.a.strides[ik]];
    let b_strides = vec![0, ops.b.strides[in_], ops.b.strides[ik]];
    Operands {
        shape,
        a: Affine { strides: a_strides, ..ops.a },
        b: Affine { strides: b_strides, ..ops.b },
        ..ops
    }
}

/// The operands of a GEMM-shaped reduce (a product of two broadcast views summed over the last
/// axis) that a tile GEMM cannot read in place, each as the un-broadcast view below its
/// outermost EXPAND: staging that view (a contiguous copy, into which its producer fuses) lets
/// the product run as a tile GEMM, where otherwise it would be a loop nest. An operand that is
/// not broadcast disqualifies the reduce (it is not a matrix product).
pub(crate) fn operands_to_stage(body: &UOp) -> Vec<UOp> {
    let Some(x) = body.as_reduce().filter(|r| (r.op, r.axes) == (ReduceOp::Add, 1)).map(|r| r.input) else {
        return Vec::new();
    };
    let shape = x.shape().to_vec();
    if shape.len() < 3 || shape.contains(&0) || x.dtype() != DType::F32 {
        return Vec::new();
    }
    let Some((lhs, rhs)) = product_operands(x) else { return Vec::new() };
    let below_broadcast = |v: &UOp| {
        let mut w = v.clone();
        while let Some(viewed) = w.as_movement().cloned() {
            if matches!(w.op(), Op::Expand(_)) {
                return Some(viewed);
            }
            w = viewed;
        }
        None
    };
    let mut stage = Vec::new();
    for v in [&lhs, &rhs] {
        let Some(base) = below_broadcast(v) else { return Vec::new() };
        if over_materialized(v).is_none_or(|p| affine(&p, &shape).is_none()) {
            stage.push(base);
        }
    }
    stage
}

/// View `v` with the node below its movement chain read as the contiguous buffer it will be
/// (a `Param` of its shape) when that node is materialized anyway (a STAGE, a REDUCE or a custom
/// kernel; reduces are their own kernels whenever tile GEMMs are made), or the 16-bit buffer
/// below a widening cast (an input, or a node materialized anyway); `None` when the node is
/// computed elementwise and would fuse into the reader.
fn over_materialized(v: &UOp) -> Option<UOp> {
    let (chain, base) = movement_chain(v);
    let materialized = |u: &UOp| matches!(u.op(), Op::Stage | Op::Reduce { .. } | Op::Custom(_));
    let as_buffer = |u: &UOp| UOp::new(Op::Param { slot: 0, shape: u.shape().to_vec() }, u.dtype(), vec![]);
    let buffer = match base.op() {
        Op::Param { .. } => base,
        _ if materialized(&base) => as_buffer(&base),
        // A widened 16-bit buffer, which the GEMM of its dtype reads in place.
        _ if without_widening(v) != *v => return Some(v.clone()),
        // A widened 16-bit node materialized anyway (activations staged in bf16), likewise.
        Op::Cast => {
            let (inner, stored) = movement_chain(&base.src()[0]);
            if !stored.dtype().is_half() || !materialized(&stored) {
                return None;
            }
            UOp::new(Op::Cast, base.dtype(), vec![reapply(&inner, as_buffer(&stored))])
        }
        _ => return None,
    };
    Some(reapply(&chain, buffer))
}

/// Whether the reduce `body` becomes a tile GEMM that reads both operands where they are, so
/// a layout pass copying one of them contiguous would only add a pass.
///
/// Operands over nodes that become buffers anyway (a staged LayerNorm output, a reduce) count
/// as in place: the GEMM reads them once they are, and the other operand (a weight read
/// transposed) needs no copy either.
pub(crate) fn reads_operands_in_place(body: &UOp) -> bool {
    if gemm_operands(body).is_some() {
        return true;
    }
    let Some(reduce) = body.as_reduce().filter(|r| (r.op, r.axes) == (ReduceOp::Add, 1)) else {
        return false;
    };
    let Some((lhs, rhs)) = product_operands(reduce.input) else { return false };
    let (Some(a), Some(b)) = (over_materialized(&lhs), over_materialized(&rhs)) else { return false };
    let product = a.binary(uopc_ir::BinaryOp::Mul, &b);
    let rebuilt = UOp::new(Op::Reduce { op: ReduceOp::Add, axes: 1 }, body.dtype(), vec![product]);
    gemm_operands(&rebuilt).is_some()
}

/// The narrowest column block a task's block-size limit narrows a GEMM task to: two
/// AVX-512 micro-kernel panels.
const MIN_LIMITED_COLUMNS: usize = 32;

/// An upper bound on the elements of one task's output block (see [`GemmTasks::new`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockLimit {
    /// The most elements of a block.
    pub elements: usize,
    /// Whether the bound must hold even at the cost of fewer rows per task.
    pub required: bool,
}

/// Whether cutting a block's `cols` columns into blocks of `narrow` pays when the block may
/// stay wide: each further column block reads the block's rows of A (`k` each) once more,
/// while a block in cache saves the epilogue one pass over the block's output (a read and a
/// write of `cols` per row) from memory.
fn narrowing_pays(k: usize, cols: usize, narrow: usize) -> bool {
    k * (cols / narrow - 1) < 2 * cols
}

/// The relative cost per element of packing B against handling A, for [`block_within`]: where
/// the GEMM reads A where it lies and packs only B (bf16 operands on a path that takes them as
/// they are, with A not transposed), [`AMX_B_PACKING_WEIGHT`] on AMX for products at least
/// [`AMX_DEEP_K`] deep and 2 otherwise, else 1 (both are packed, the 16-bit ones widened).
fn b_packing_weight(operands: &Operands) -> f64 {
    let bf16 = operands.a.dtype == DType::BF16 && operands.b.dtype == DType::BF16;
    let k = operands.shape.last().copied().unwrap_or(0);
    let path = uopc_tile::Bf16Path::detect();
    match (bf16 && !operands.a_trans, path) {
        (true, uopc_tile::Bf16Path::Amx) if k >= AMX_DEEP_K => AMX_B_PACKING_WEIGHT,
        (true, _) if !path.widens() => 2.0,
        _ => 1.0,
    }
}

/// [`b_packing_weight`] on AMX: its tiles multiply a block several times faster than it packs
/// B's slab into pairs, while A is read in place, so taller blocks (which pack B fewer times
/// over) pay until A's rows stop fitting the caches: with this weight a 32K-element block is
/// 512 x 64.
const AMX_B_PACKING_WEIGHT: f64 = 8.0;

/// The depth from which packing B outweighs the rest of an AMX task's block: a shallower
/// product packs little, and its block's cost is writing the result, which narrower rows only
/// slow down.
const AMX_DEEP_K: usize = 256;

/// The block of at most `elements` that a task of a `rows x cols` block (of an `m`-row GEMM)
/// is cut to when the bound must hold. Each task handles its rows of A (packs them, a 16-bit
/// A widened, unless read in place) and packs its columns of B over all of k, so the cost per
/// multiply-add goes as `1 / cols + b_weight / rows`: of the blocks that fit (the columns
/// narrowed, not below [`MIN_LIMITED_COLUMNS`]; the one whose rows balance the two terms; the
/// rows cut until the columns fit) the one with the least. (16 rows of 1536 columns packed a
/// 768 x 3072 B 128 times over; 1024 rows of 32 columns, a 1024 x 1024 A 32 times.)
fn block_within(m: usize, (rows, cols): (usize, usize), elements: usize, b_weight: f64) -> (usize, usize) {
    let narrowed = (rows, largest_divisor_at_most(cols, (elements / rows).max(1)));
    // rows = sqrt(b_weight * elements) minimizes 1 / cols + b_weight / rows at rows x cols =
    // elements.
    let balanced_rows = largest_divisor_at_most(m, (b_weight * elements as f64).sqrt() as usize);
    let balanced = (balanced_rows, largest_divisor_at_most(cols, (elements / balanced_rows).max(1)));
    let fitted_rows = largest_divisor_at_most(m, (elements / cols).max(1));
    let fitted = (fitted_rows, largest_divisor_at_most(cols, (elements / fitted_rows).max(1)));
    let wide_enough = |&(_, c): &(usize, usize)| c >= MIN_LIMITED_COLUMNS.min(cols);
    let packing = |&(r, c): &(usize, usize)| 1.0 / c as f64 + b_weight / r as f64;
    [narrowed, balanced]
        .into_iter()
        .filter(wide_enough)
        .chain([fitted])
        .min_by(|x, y| packing(x).total_cmp(&packing(y)))
        .unwrap_or(fitted)
}

/// One GEMM kernel cut into THREAD tasks: task `t` computes the `rows x cols` block of the
/// flattened `(items * m, n)` result whose first row is `rows * row_task` and first column
/// `cols * col_block`, where `t = row_task * col_blocks + col_block`.
pub(crate) struct GemmTasks {
    operands: Operands,
    /// Output rows of one task's block.
    pub rows: usize,
    /// Output columns of one task's block.
    pub cols: usize,
    /// Row blocks per batch item, and column blocks.
    row_blocks: usize,
    col_blocks: usize,
    /// The THREAD range over the tasks (range id 0).
    pub task: UOp,
    /// The flat offsets in A and B of the task's blocks (made first, so the nodes of a plain
    /// GEMM kernel are made in the same order as always and its code is unchanged).
    a_start: UOp,
    b_start: UOp,
    /// The one task's GEMM call cuts itself over the pool ([`GemmShape::parallel`]).
    split_in_call: bool,
}

impl GemmTasks {
    /// The cut of GEMM-shaped `body` into tasks, or `None` when `body` is not one.
    ///
    /// With a `limit`, a task's block should hold at most `limit.elements` elements: the
    /// columns are narrowed to a smaller divisor of themselves, though not below
    /// [`MIN_LIMITED_COLUMNS`] (narrower calls would spend their time packing); otherwise the
    /// block stays wider than the limit, as it does for a transposed A. With
    /// `limit.required` the block always fits (a scratch block on the stack): rows and columns
    /// are cut as [`block_within`] finds packs least.
    pub(crate) fn new(body: &UOp, limit: Option<BlockLimit>) -> Option<GemmTasks> {
        GemmTasks::cut(body, limit, false)
    }

    /// [`GemmTasks::new`] without a limit for a GEMM whose calls write the product rounded to
    /// its 16-bit operands' type: an f16 one may be one call that cuts itself over the pool,
    /// as an f32 one may ([`uopc_tile::gemm_f16_rounded`]).
    pub(crate) fn rounded(body: &UOp) -> Option<GemmTasks> {
        GemmTasks::cut(body, None, true)
    }

    /// [`GemmTasks::new`], the call rounding its product when `rounded`.
    fn cut(body: &UOp, limit: Option<BlockLimit>, rounded: bool) -> Option<GemmTasks> {
        let operands = batch_folded_into_rows(gemm_operands(body)?);
        let r = operands.shape.len();
        let [m, n] = [operands.shape[r - 3], operands.shape[r - 2]];
        let k = operands.shape[r - 1];
        let items: usize = operands.shape[..r - 3].iter().product();
        // The machine's core count, not the calling pool's: a cached plan serves every pool.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        // Only the f32 GEMM and the rounded f16 one cut themselves, and only a block without a
        // size limit can be whole, or one whose whole product fits the limit (a few f32 rows
        // cut along k).
        let f32_operands = operands.a.dtype == DType::F32 && operands.b.dtype == DType::F32;
        let rounded_f16 = rounded && operands.a.dtype == DType::F16 && operands.b.dtype == DType::F16;
        let may_split = limit.is_none() && (f32_operands || rounded_f16);
        let fits = limit.is_none_or(|l| m * n <= l.elements);
        let (a_trans, b_trans) = (operands.a_trans, operands.b_trans);
        let grid = gemm_grid::few_rows_by_depth(items, m, n, k, cores, (a_trans, b_trans))
            .filter(|_| f32_operands && fits)
            .unwrap_or_else(|| {
                gemm_grid::choose(&gemm_grid::GridModel::of_this_machine(), items, m, n, k, cores, may_split)
            });
        let (mut rows, mut cols) = (grid.rows, grid.cols);
        // Narrower column blocks repack a transposed A once more each (it is copied into strips
        // per call), which costs more than the epilogue saves unless the block must fit. A
        // call that cuts itself has the whole product as its block, which then fits.
        let limit = limit.filter(|l| !grid.split_in_call && (l.required || !operands.a_trans));
        if let Some(BlockLimit { elements, required }) = limit {
            if required {
                (rows, cols) = block_within(m, (rows, cols), elements, b_packing_weight(&operands));
            } else {
                let narrow = largest_divisor_at_most(cols, (elements / rows).max(1));
                if narrow >= MIN_LIMITED_COLUMNS.min(cols) && narrowing_pays(k, cols, narrow) {
                    cols = narrow;
                }
            }
        }
        let row_tasks = items * (m / rows);
        let (row_blocks, col_blocks) = (m / rows, n / cols);
        let task = range(row_tasks * col_blocks, 0, AxisType::Thread);
        let mut tasks = GemmTasks {
            operands,
            rows,
            cols,
            row_blocks,
            col_blocks,
            task,
            a_start: uopc_ir::idx(0),
            b_start: uopc_ir::idx(0),
            split_in_call: grid.split_in_call,
        };
        (tasks.a_start, tasks.b_start) = tasks.operand_starts();
        Some(tasks)
    }

    /// The flat offsets in A and in B of the task's first row block and column block.
    fn operand_starts(&self) -> (UOp, UOp) {
        let Operands { shape, a, b, .. } = &self.operands;
        let r = shape.len();
        let batch = &shape[..r - 3];
        let (im, in_) = (r - 3, r - 2);
        let (row_task, col_block) = self.blocks();
        let (item, block) = (row_task.idiv(self.row_blocks as i64), row_task.modulo(self.row_blocks as i64));
        let a_start =
            batch_offset(&item, batch, &a.strides) + &block * (self.rows * a.strides[im]) + a.base as i64;
        let b_start = batch_offset(&item, batch, &b.strides)
            + &col_block * (self.cols * b.strides[in_])
            + b.base as i64;
        (a_start, b_start)
    }

    /// Whether the tasks' blocks are narrower (or shorter) than the plain GEMM's, so each
    /// call packs less of B but its share of A once more, while A is transposed (copied into
    /// strips by every call): then the cut costs more packing than a block in cache saves.
    pub(crate) fn repacks_transposed_a(&self, plain: &GemmTasks) -> bool {
        self.operands.a_trans && (self.cols < plain.cols || self.rows < plain.rows)
    }

    /// The element types of A and B.
    pub(crate) fn operand_dtypes(&self) -> (DType, DType) {
        (self.operands.a.dtype, self.operands.b.dtype)
    }

    /// The `[batch.., m, n]` output shape.
    pub(crate) fn output_shape(&self) -> &[usize] {
        &self.operands.shape[..self.operands.shape.len() - 1]
    }

    /// The task's row block over all batch items, and its column block.
    fn blocks(&self) -> (UOp, UOp) {
        let t = &self.task;
        (t.idiv(self.col_blocks as i64), t.modulo(self.col_blocks as i64))
    }

    /// The flat offset in the contiguous output of the task's first element.
    pub(crate) fn output_start(&self) -> UOp {
        let n = self.output_shape().last().copied().unwrap_or(1);
        let (row_task, col_block) = self.blocks();
        &row_task * (self.rows * n) + &col_block * self.cols
    }

    /// The task's first row in the flattened `(items * m, n)` output, and its first column.
    pub(crate) fn first_row_and_column(&self) -> (UOp, UOp) {
        let (row_task, col_block) = self.blocks();
        (&row_task * self.rows, &col_block * self.cols)
    }

    /// The task's tile GEMM, writing its block at `dst` (the INDEX of the block's first
    /// element) with `ldc` elements between rows.
    pub(crate) fn gemm(&self, dst: UOp, ldc: usize) -> UOp {
        let Operands { shape, a, a_trans, lda, b, b_trans, ldb } = &self.operands;
        let op = TileOp::Gemm(GemmShape {
            m: self.rows,
            n: self.cols,
            k: shape[shape.len() - 1],
            lda: *lda,
            ldb: *ldb,
            ldc,
            a_trans: *a_trans,
            b_trans: *b_trans,
            accumulate: false,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: self.split_in_call,
        });
        let abuf = buffer(a.slot, a.dtype, a.len);
        let bbuf = buffer(b.slot, b.dtype, b.len);
        tile(op, &[abuf.index(&self.a_start), bbuf.index(&self.b_start), dst])
    }
}

/// The loop program of a GEMM-shaped kernel `body` writing `out`, or `None` when the body is
/// anything else (then it is rangeified as usual). Leading axes of the body are batch axes:
/// one THREAD iteration per batch item, block of output rows and block of output columns,
/// each one tile GEMM.
pub(crate) fn lower_gemm(body: &UOp, out: &UOp) -> Option<UOp> {
    Some(tile_gemm_per_task(&GemmTasks::new(body, None)?, out))
}

/// The program running each of `tasks` as one tile GEMM writing its block of the contiguous
/// `out` (each task's block is a stretch of rows `n` apart).
fn tile_gemm_per_task(tasks: &GemmTasks, out: &UOp) -> UOp {
    let n = tasks.output_shape().last().copied().unwrap_or(1);
    let g = tasks.gemm(out.index(tasks.output_start()), n);
    sink(&[sink(&[g]).end(std::slice::from_ref(&tasks.task))])
}

/// Whether a tile GEMM of two `half` operands writes its product rounded to `half` itself,
/// strip by strip while the sums are in cache or in AMX's blocks: always for f16 (on the
/// portable ISA through an f32 buffer of the call's own), and for bf16 on AMX or a vector path
/// that widens into the f32 driver. Elsewhere a bf16 GEMM would round through an f32 buffer
/// of the whole block, and the epilogue's small scratch blocks do better.
pub(crate) fn rounds_in_call(half: DType) -> bool {
    match half {
        DType::F16 => true,
        DType::BF16 => uopc_tile::Bf16Path::detect().rounds_in_cache(),
        _ => false,
    }
}

/// The product a kernel body only rounds: the node under the body's CAST, reshapes between
/// (which keep row-major order); `None` when the body is not a CAST.
pub(crate) fn rounded_product(body: &UOp) -> Option<&UOp> {
    if !matches!(body.op(), Op::Cast) {
        return None;
    }
    let mut x = &body.src()[0];
    while matches!(x.op(), Op::Reshape(_)) {
        x = &x.src()[0];
    }
    Some(x)
}

/// The loop program of a kernel `body` that only rounds a GEMM of two 16-bit operands to
/// their type (the GEMM under a CAST, reshapes between), writing `out`: each task's tile GEMM
/// writes its block of `out` rounded itself ([`uopc_tile::gemm_f16_rounded`],
/// [`uopc_tile::gemm_bf16_rounded`]), so the tasks need no f32 scratch and take the plain
/// GEMM's grid (tall and wide blocks that pack B once per many rows; an f16 product may be one
/// call that cuts itself). `None` for any other body, or where [`rounds_in_call`] says the
/// tile GEMM would not round in cache.
pub(crate) fn lower_rounded_gemm(body: &UOp, out: &UOp) -> Option<UOp> {
    let half = out.dtype();
    let gemm = rounded_product(body).filter(|_| body.dtype() == half)?;
    if !matches!(gemm.op(), Op::Reduce { .. }) || !rounds_in_call(half) {
        return None;
    }
    let tasks = GemmTasks::rounded(gemm)?;
    let Operands { a, b, .. } = &tasks.operands;
    if a.dtype != half || b.dtype != half {
        return None;
    }
    // The output is contiguous and reshapes keep row-major order, as for a plain GEMM.
    Some(tile_gemm_per_task(&tasks, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uopc_ir::interp::{Precision, run};
    use uopc_ir::{BinaryOp, HostBuffer};

    fn node(op: Op, src: UOp) -> UOp {
        UOp::new(op, DType::F32, vec![src])
    }

    #[test]
    fn a_bounded_block_is_cut_to_pack_least() {
        // Few rows of all columns, or all rows of a few columns, each repack one operand
        // many times over: a block near square packs least.
        assert_eq!(block_within(2048, (2048, 1536), 32 * 1024, 1.0), (128, 256));
        assert_eq!(block_within(1024, (1024, 512), 32 * 1024, 1.0), (128, 256));
        // Where only B is packed, taller blocks pack it fewer times.
        assert_eq!(block_within(2048, (2048, 1536), 32 * 1024, 2.0), (256, 128));
        // Rows that fit whole keep their count; only the columns narrow.
        assert_eq!(block_within(128, (128, 1536), 32 * 1024, 1.0), (128, 256));
        // A prime row count has no near-square divisor: one row per block, all columns.
        assert_eq!(block_within(2039, (2039, 1536), 32 * 1024, 1.0), (1, 1536));
        for (m, rows, cols) in [(2048, 2048, 1536), (300, 300, 768), (7, 7, 40000)] {
            let (r, c) = block_within(m, (rows, cols), 32 * 1024, 2.0);
            assert!(r * c <= 32 * 1024 && m % r == 0 && cols % c == 0, "{m} {rows} {cols}: {r} x {c}");
        }
    }

    /// `sum_k A[t, i, k] * B[k, j]` over `items` batch items: A in slot 0, stored `(items, m, k)`,
    /// or `(m, items, k)` and permuted when `interleaved` (its items' rows then alternate); B in
    /// slot 1, `(k, n)`, shared by every item.
    fn shared_b_product(items: usize, m: usize, n: usize, k: usize, interleaved: bool) -> UOp {
        let a = if interleaved {
            let stored = UOp::new(Op::Param { slot: 0, shape: vec![m, items, k] }, DType::F32, vec![]);
            node(Op::Permute(vec![1, 0, 2]), stored)
        } else {
            UOp::new(Op::Param { slot: 0, shape: vec![items, m, k] }, DType::F32, vec![])
        };
        let a = node(Op::Expand(vec![items, m, n, k]), node(Op::Reshape(vec![items, m, 1, k]), a));
        let b = UOp::new(Op::Param { slot: 1, shape: vec![k, n] }, DType::F32, vec![]);
        let b = node(Op::Reshape(vec![1, 1, n, k]), node(Op::Permute(vec![1, 0]), b));
        let b = node(Op::Expand(vec![items, m, n, k]), b);
        let product = UOp::new(Op::Binary(BinaryOp::Mul), DType::F32, vec![a, b]);
        node(Op::Reduce { op: ReduceOp::Add, axes: 1 }, product)
    }

    #[test]
    fn a_shared_b_folds_the_batch_into_rows_and_computes_the_same() {
        for (items, m, n, k, interleaved) in
            [(4, 6, 5, 3, false), (3, 1, 7, 4, false), (2, 5, 3, 2, true), (1, 4, 4, 4, false)]
        {
            let body = shared_b_product(items, m, n, k, interleaved);
            let tasks = GemmTasks::new(&body, None).expect("a GEMM");
            // Rows that run on from item to item fold; interleaved ones stay a batch.
            let want_shape = if interleaved { vec![items, m, n] } else { vec![items * m, n] };
            assert_eq!(tasks.output_shape(), &want_shape[..], "({items}, {m}, {n}, {k}, {interleaved})");
            let a: Vec<f32> = (0..items * m * k).map(|v| (v % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 * 0.5 - 1.0).collect();
            // A's element (t, i, p) as stored.
            let at = |t: usize, i: usize, p: usize| {
                if interleaved { a[(i * items + t) * k + p] } else { a[(t * m + i) * k + p] }
            };
            // Small integers and halves: every product and sum is exact in f32.
            let want: Vec<f32> = (0..items * m * n)
                .map(|e| {
                    let (t, i, j) = (e / (m * n), e / n % m, e % n);
                    (0..k).map(|p| at(t, i, p) * b[p * n + j]).sum()
                })
                .collect();
            let out = buffer(2, DType::F32, items * m * n);
            let program = lower_gemm(&body, &out).expect("lowers");
            uopc_ir::verify(&program).expect("a well-formed program");
            let mut bufs =
                [HostBuffer::F32(a.clone()), HostBuffer::F32(b), HostBuffer::zeros(DType::F32, want.len())];
            run(&program, &mut bufs, Precision::Native).expect("runs");
            let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
            assert_eq!(bufs[2].to_f64_vec(), want, "({items}, {m}, {n}, {k}, {interleaved})");
        }
    }
}
