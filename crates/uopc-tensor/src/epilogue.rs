//! GEMM epilogues: the elementwise consumers of a tile GEMM (a bias, an activation, a residual
//! add, a scale, the rounding cast of a 16-bit matmul) computed on each task's output block
//! right after the GEMM wrote it, while it is in cache, instead of in a kernel of their own
//! that reads the whole GEMM output back from memory.
//!
//! Two halves: [`fuse_gemm_epilogues`] decides, on the cut graph, which GEMM reduces stop
//! being kernels of their own (the kernel of their one consumer computes them), and
//! [`lower_gemm_epilogue`] lowers such a consumer kernel as a tile GEMM per task followed by
//! a loop over the task's block that rangeifies the rest of the body on top of it.

use crate::error::Result;
use crate::opt::Opts;
use crate::rangeify::Ctx;
use crate::tilemap::{BlockLimit, GemmTasks};
use crate::util::numel;
use std::collections::{HashMap, HashSet};
use uopc_ir::{AxisType, DType, Op, TileOp, UOp, alloc, idx, range, simplify, sink, tile};

/// The most elements of a task's output block in a kernel with an epilogue: 128 KiB of f32,
/// which stays in the core's L2 between the GEMM writing it and the epilogue reading it back
/// (the whole-row blocks of a plain GEMM task, 3 MiB for 256 rows of 3072, would not), and,
/// as the f32 scratch block of a non-f32 output, is a small part of any worker thread's stack,
/// where it lives.
const BLOCK_ELEMENTS: usize = 32 * 1024;

/// The node a point's kernel body starts from: a STAGE is a copy of its source.
fn body_start(p: &UOp) -> UOp {
    p.unstaged().clone()
}

/// The other points the kernel of point `p` reads (its body's leaves that are points).
fn points_read(p: &UOp, points: &HashSet<UOp>) -> Vec<UOp> {
    if matches!(p.op(), Op::Custom(_)) {
        // A custom kernel reads its sources whole.
        return p.src().to_vec();
    }
    let mut read = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![body_start(p)];
    while let Some(u) = stack.pop() {
        if !seen.insert(u.clone()) {
            continue;
        }
        if u != *p && points.contains(&u) {
            read.push(u);
            continue;
        }
        stack.extend(u.src().iter().cloned());
    }
    read
}

/// Whether the kernel body starting at `start` reads `gemm` only elementwise, so it needs the
/// GEMM's value at its own output element and nowhere else: every node on a path from `start`
/// down to `gemm` is an ALU op or a RESHAPE (which keeps every element's row-major position;
/// a permute, broadcast or shrink would read other elements, a reduce a whole row of them).
/// Points other than `gemm` (and `start`, the point whose body this is) are leaves of the
/// body and are not walked into.
fn reads_elementwise(start: &UOp, gemm: &UOp, points: &HashSet<UOp>) -> bool {
    if start == gemm || numel(start.shape()) != numel(gemm.shape()) {
        return false;
    }
    // Post-order over the body: whether each node reaches `gemm`.
    let mut reaches: HashMap<UOp, bool> = HashMap::new();
    let mut stack = vec![(start.clone(), false)];
    while let Some((u, ready)) = stack.pop() {
        if reaches.contains_key(&u) {
            continue;
        }
        if u == *gemm {
            reaches.insert(u, true);
            continue;
        }
        if (u != *start && points.contains(&u)) || u.src().is_empty() {
            reaches.insert(u, false);
            continue;
        }
        if !ready {
            stack.push((u.clone(), true));
            stack.extend(u.src().iter().map(|s| (s.clone(), false)));
            continue;
        }
        let r = u.src().iter().any(|s| reaches[s]);
        if r && !(u.op().is_alu() || matches!(u.op(), Op::Reshape(_))) {
            return false;
        }
        reaches.insert(u, r);
    }
    reaches[start]
}

/// The cost model's decision for GEMM epilogues: which GEMM reduces among `points` (the
/// materialization points of the graph under `roots`, in execution order) are computed inside
/// the kernel of their consumer instead of being kernels of their own. Returns the remaining
/// points, in the same order, and the consumer points that now carry a GEMM epilogue.
///
/// A reduce is fused when `is_tile_gemm` holds for it and its consumer's dtype (it runs as a
/// tile GEMM, which writes a block of output per task, and its blocks suit an epilogue: see
/// [`epilogue_pays`]), it is not a root, exactly one other kernel reads it,
/// and that kernel reads it only elementwise at its own output index ([`reads_elementwise`]):
/// the fused kernel then saves one write and one read of the whole GEMM output, and computes
/// nothing twice. It is refused when another kernel reads the GEMM output too (transposed, or
/// summed by a reduction): that read forces the output to be materialized anyway, and the
/// fused form would save only the consumer's read while writing a second buffer. A consumer
/// takes at most one GEMM, so each fused kernel is one GEMM and its epilogue.
pub(crate) fn fuse_gemm_epilogues(
    roots: &[UOp],
    points: Vec<UOp>,
    is_tile_gemm: impl Fn(&UOp, DType, bool) -> bool,
) -> (Vec<UOp>, HashSet<UOp>) {
    let point_set: HashSet<UOp> = points.iter().cloned().collect();
    let root_set: HashSet<&UOp> = roots.iter().collect();
    let mut readers: HashMap<UOp, Vec<UOp>> = HashMap::new();
    for p in &points {
        for r in points_read(p, &point_set) {
            let list = readers.entry(r).or_default();
            if !list.contains(p) {
                list.push(p.clone());
            }
        }
    }
    let mut fused: HashSet<UOp> = HashSet::new();
    let mut with_epilogue: HashSet<UOp> = HashSet::new();
    for gemm in &points {
        if !matches!(gemm.op(), Op::Reduce { .. }) || root_set.contains(gemm) {
            continue;
        }
        let [consumer] = readers.get(gemm).map_or(&[][..], Vec::as_slice) else { continue };
        if with_epilogue.contains(consumer)
            || matches!(consumer.op(), Op::Custom(_))
            || !reads_elementwise(&body_start(consumer), gemm, &point_set)
            || !is_tile_gemm(gemm, consumer.dtype(), only_rounds(&body_start(consumer), gemm))
        {
            continue;
        }
        fused.insert(gemm.clone());
        with_epilogue.insert(consumer.clone());
    }
    let points = points.into_iter().filter(|p| !fused.contains(p)).collect();
    (points, with_epilogue)
}

/// Whether the consumer body starting at `start` only rounds `gemm` to its own dtype (what
/// [`crate::tilemap::lower_rounded_gemm`] lowers).
fn only_rounds(start: &UOp, gemm: &UOp) -> bool {
    crate::tilemap::rounded_product(start) == Some(gemm)
}

/// Whether the GEMM kernel `body` pays for an epilogue writing `dtype` (`only_rounds`: the
/// epilogue only rounds the product to `dtype`): an f32 output is the GEMM's own block, so
/// nothing changes but the blocks' width; a product of two `dtype` operands that the tile GEMM
/// rounds itself ([`crate::tilemap::rounds_in_call`]) keeps the plain GEMM's blocks; any
/// other output needs an f32 scratch block that must fit [`BLOCK_ELEMENTS`], and when that
/// forces smaller blocks than the plain GEMM's with a transposed A, repacking A for every
/// narrower block costs more than the separate rounding pass it saves.
pub(crate) fn epilogue_pays(body: &UOp, dtype: DType, only_rounds: bool) -> bool {
    if dtype == DType::F32 {
        return true;
    }
    let plain = GemmTasks::new(body, None);
    let rounds_itself =
        |t: &GemmTasks| t.operand_dtypes() == (dtype, dtype) && crate::tilemap::rounds_in_call(dtype);
    if only_rounds && plain.as_ref().is_some_and(rounds_itself) {
        return true;
    }
    let limit = BlockLimit { elements: BLOCK_ELEMENTS, required: true };
    match (plain, GemmTasks::new(body, Some(limit))) {
        (Some(plain), Some(limited)) => !limited.repacks_transposed_a(&plain),
        _ => false,
    }
}

/// `root` with every node for which `replace` gives a node replaced by it (and not walked
/// into), the nodes above rebuilt over their new sources.
fn replace_nodes(root: &UOp, replace: impl Fn(&UOp) -> Option<UOp>) -> UOp {
    let mut map: HashMap<UOp, UOp> = HashMap::new();
    let mut stack = vec![(root.clone(), false)];
    while let Some((u, ready)) = stack.pop() {
        if map.contains_key(&u) {
            continue;
        }
        if let Some(new) = replace(&u) {
            map.insert(u, new);
            continue;
        }
        if u.src().is_empty() {
            map.insert(u.clone(), u);
            continue;
        }
        if !ready {
            stack.push((u.clone(), true));
            stack.extend(u.src().iter().map(|s| (s.clone(), false)));
            continue;
        }
        let src: Vec<UOp> = u.src().iter().map(|s| map[s].clone()).collect();
        let new = if src.as_slice() == u.src() { u.clone() } else { u.with_src(src) };
        map.insert(u, new);
    }
    map[root].clone()
}

/// `value` with every INDEX into `placeholder` replaced by `by`, the INDEX of the one element
/// those reads are known to address.
fn redirect_reads(value: &UOp, placeholder: &UOp, by: &UOp) -> UOp {
    replace_nodes(value, |u| u.as_index().is_some_and(|i| i.base == placeholder).then(|| by.clone()))
}

/// The per-axis index in `shape` of the row-major offset `flat`, each axis simplified.
fn unravel(flat: &UOp, shape: &[usize]) -> Vec<UOp> {
    let mut index = vec![uopc_ir::idx(0); shape.len()];
    let mut stride = 1usize;
    for k in (0..shape.len()).rev() {
        if shape[k] != 1 {
            index[k] = simplify(&flat.idiv(stride as i64).modulo(shape[k] as i64));
        }
        stride *= shape[k];
    }
    index
}

/// What a tile op finishes of an f32 epilogue: the activation of the loop's values, or the
/// GEMM's block (a gradient) scaled by the activation's derivative at the loop's values.
enum Tail {
    Value(uopc_tile::Activation),
    Gradient(uopc_tile::Activation),
}

/// The widest row whose activation input a gradient epilogue keeps on the worker's stack.
const GRADIENT_ROW_MAX: usize = 16 * 1024;

/// The value the loop of an f32 epilogue computes, and the tile op that finishes it, when
/// `body` ends in an activation ([`crate::activation_rows::tile_activation`]) or is the
/// gradient of one with `gemm` as the cotangent
/// ([`crate::activation_rows::tile_activation_grad`]) of rows at most [`GRADIENT_ROW_MAX`].
fn activation_tail(body: &UOp, gemm: &UOp) -> Option<(UOp, Tail)> {
    if let Some((x, kind)) = crate::activation_rows::tile_activation(body) {
        return Some((x, Tail::Value(kind)));
    }
    let n = gemm.shape().last().copied().unwrap_or(1);
    let (x, kind) = crate::activation_rows::tile_activation_grad(body, gemm)?;
    (n <= GRADIENT_ROW_MAX).then_some((x, Tail::Gradient(kind)))
}

/// The loop program of a kernel `body` (inputs as `Param`s with slots below `out`'s) that is
/// elementwise ops and reshapes over one GEMM-shaped reduce, writing `out`; `None` when `body`
/// is not of that form or the reduce is not a tile GEMM (then the body is rangeified as
/// usual, the reduce as a loop nest).
///
/// Each THREAD task runs the tile GEMM of its output block, then a loop over the block (its
/// columns innermost, which the backend vectorizes) that reads the GEMM's value back and
/// applies the rest of the body at the element's output index (other inputs read there: a
/// bias along the rows, a residual). An f32 output is its own block (the GEMM writes it, the
/// epilogue rewrites it in place); any other dtype gets an f32 scratch block per task. Either
/// way the task's block is kept to [`BLOCK_ELEMENTS`]. An f32 body that ends in an activation,
/// or is the gradient of one with the GEMM as the cotangent ([`activation_tail`]), leaves that
/// to a tile op on each row right after the loop wrote it: the loop computes the activation's
/// input (into the output row, or for the gradient into a row of its own), and
/// [`TileOp::Activation`] or [`TileOp::ActivationGrad`] finishes the row, 16 elements per
/// instruction where the loop's vectors take four.
pub(crate) fn lower_gemm_epilogue(body: &UOp, out: &UOp) -> Option<Result<UOp>> {
    let Op::Buffer { slot: out_slot, .. } = out.op() else { return None };
    let nodes = UOp::toposort(std::slice::from_ref(body));
    let mut reduces = nodes.iter().filter(|u| matches!(u.op(), Op::Reduce { .. }));
    let gemm = reduces.next()?;
    if reduces.next().is_some() || !reads_elementwise(body, gemm, &HashSet::new()) {
        return None;
    }
    let in_place = out.dtype() == DType::F32;
    let tail = if in_place { activation_tail(body, gemm) } else { None };
    let body = tail.as_ref().map_or(body, |(x, _)| x);
    // A scratch block lives on the stack: its bound is a must. An output block may be wider.
    let limit = BlockLimit { elements: BLOCK_ELEMENTS, required: !in_place };
    let tasks = GemmTasks::new(gemm, Some(limit))?;
    let n = tasks.output_shape().last().copied().unwrap_or(1);
    let (rows, cols) = (tasks.rows, tasks.cols);
    // Range 0 is the THREAD range over the tasks. A block axis of one element gets no loop
    // (index 0), as in rangeify: `simplify` folds a RANGE of one iteration to 0, so no index
    // below would use it, and an END of it would close a loop its body never opened.
    let block_loop = |extent: usize, id: usize| (extent > 1).then(|| range(extent, id, AxisType::Loop));
    let (row_loop, col_loop) = (block_loop(rows, 1), block_loop(cols, 2));
    let row = row_loop.clone().unwrap_or_else(|| idx(0));
    let col = col_loop.clone().unwrap_or_else(|| idx(0));
    let start = tasks.output_start();
    let scratch = alloc(0, DType::F32, rows * cols).after(std::slice::from_ref(&tasks.task));
    // The element's row-major offset, in the GEMM's output and in the body's alike (only
    // elementwise ops and reshapes lie between them).
    let flat = simplify(&(&start + &row * n + &col));
    // Its index in the body's shape: when the body keeps the GEMM's rows of `n` (a reshape
    // that only splits or merges the leading axes), the row and column separately, so a
    // bias along the rows is read at the column alone and a residual affinely in it.
    let shape = body.shape();
    let index = match shape.split_last() {
        Some((&last, lead)) if last == n => {
            let (first_row, first_col) = tasks.first_row_and_column();
            let mut index = unravel(&simplify(&(first_row + &row)), lead);
            index.push(simplify(&(first_col + &col)));
            index
        }
        _ => unravel(&flat, shape),
    };
    // The GEMM's values stand in the body as a buffer of a slot no input uses. The body reads
    // them only at the element's own offset (only elementwise ops and reshapes lie between),
    // so each such read becomes a read of the element's place in the task's block.
    let placeholder_param =
        UOp::new(Op::Param { slot: out_slot.index() + 1, shape: gemm.shape().to_vec() }, DType::F32, vec![]);
    let placeholder = uopc_ir::buffer(out_slot.index() + 1, DType::F32, numel(gemm.shape()));
    let stand_in = replace_nodes(body, |u| (u == gemm).then(|| placeholder_param.clone()));
    let mut ctx = Ctx::new(Opts::default(), true);
    let v = match ctx.value_at(&stand_in, &index) {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    let (g, at_block) = if in_place {
        (tasks.gemm(out.index(&start), n), flat.clone())
    } else {
        (tasks.gemm(scratch.index(0), cols), simplify(&(&row * cols + &col)))
    };
    let block = if in_place { out.clone() } else { scratch }.after(std::slice::from_ref(&g));
    let block_value = block.index(&at_block);
    let v = redirect_reads(&v, &placeholder, &block_value);
    // The GEMM is the task's first effect (the epilogue's loads wait for it), in the task.
    // The value before its rounding cast (the body's own, to the output's dtype, or the one
    // added below).
    let uncast = match v.op() {
        Op::Cast if v.dtype() == out.dtype() => &v.src()[0],
        _ => &v,
    };
    let task_body = if !in_place && *uncast == block_value.load() && out.dtype().half().is_some() {
        // Only the rounding cast of a 16-bit product: one conversion of the block, 16 values
        // per instruction where the loop's CAST converts four at a time with integer
        // operations (and, for f16, costs as much as the GEMM's own packing).
        let convert = TileOp::Convert { rows, cols, lds: cols, ldd: n };
        sink(&[g, tile(convert, &[block.index(0), out.index(&start)])])
    } else {
        let v = if v.dtype() == out.dtype() { v } else { v.cast(out.dtype()) };
        let end = |x: UOp, l: &Option<UOp>| l.iter().fold(x, |x, l| x.end(std::slice::from_ref(l)));
        let row_start = simplify(&(&start + &row * n));
        // Each row's tile op as soon as the loop wrote the row, while it is in L1.
        let row_done = match tail {
            None => end(out.index(flat).store(v), &col_loop),
            Some((_, Tail::Value(kind))) => {
                let written = end(out.index(flat).store(v), &col_loop);
                let act = TileOp::Activation { rows: 1, cols, ld: n, kind };
                tile(act, &[out.after(std::slice::from_ref(&written)).index(&row_start)])
            }
            Some((_, Tail::Gradient(kind))) => {
                // The loop writes the activation's input into a row of its own; the GEMM's
                // block is the incoming gradient, scaled in place.
                let x_row = alloc(0, DType::F32, cols).after(std::slice::from_ref(&tasks.task));
                let written = end(x_row.index(&col).store(v), &col_loop);
                let op = TileOp::ActivationGrad { rows: 1, cols, ldx: cols, ldg: n, kind };
                let x_at = x_row.after(std::slice::from_ref(&written)).index(0);
                tile(op, &[x_at, out.after(&[g.clone(), written]).index(&row_start)])
            }
        };
        sink(&[g, end(row_done, &row_loop)])
    };
    Some(Ok(sink(&[task_body.end(std::slice::from_ref(&tasks.task))])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use uopc_ir::interp::{Precision, run};
    use uopc_ir::{BinaryOp, HostBuffer, ReduceOp, buffer};

    /// The kernel body `consumer(sum_k A[i, k] * B[k, j])` for an `m x k` A in slot 0 and a
    /// `k x n` B in slot 1, both row-major, as the kernelizer hands it over.
    fn gemm_body(m: usize, n: usize, k: usize, consumer: impl Fn(UOp) -> UOp) -> UOp {
        let f32_node = |op: Op, src: UOp| UOp::new(op, DType::F32, vec![src]);
        let param = |slot: usize, shape: Vec<usize>| UOp::new(Op::Param { slot, shape }, DType::F32, vec![]);
        let a = f32_node(Op::Reshape(vec![m, 1, k]), param(0, vec![m, k]));
        let a = f32_node(Op::Expand(vec![m, n, k]), a);
        let b = f32_node(Op::Permute(vec![1, 0]), param(1, vec![k, n]));
        let b = f32_node(Op::Reshape(vec![1, n, k]), b);
        let b = f32_node(Op::Expand(vec![m, n, k]), b);
        let product = UOp::new(Op::Binary(BinaryOp::Mul), DType::F32, vec![a, b]);
        consumer(f32_node(Op::Reduce { op: ReduceOp::Add, axes: 1 }, product))
    }

    /// Rows and columns of one element (a dot product, a matrix times a vector, one row
    /// through a layer) make blocks with an axis of one element: the program must still be
    /// well formed (every END closes a loop its body runs in) and compute the product.
    #[test]
    fn blocks_of_one_row_or_one_column_end_only_the_loops_they_open() {
        for (m, n, k) in [(1, 1, 3), (1, 1, 64), (4, 1, 5), (1, 7, 5), (1, 3072, 8), (3, 5, 2)] {
            let a: Vec<f32> = (0..m * k).map(|v| (v % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 * 0.5 - 1.0).collect();
            // Small integers and halves: every product and sum is exact in f32.
            let want: Vec<f32> =
                (0..m * n).map(|e| (0..k).map(|p| a[e / n * k + p] * b[p * n + e % n]).sum()).collect();
            // An f32 output (the GEMM writes it, the epilogue rewrites it in place: here a
            // reshape to one axis, like the one by which `matmul` drops a vector's axis) and a
            // bf16 one (an f32 scratch block, rounded).
            for dtype in [DType::F32, DType::BF16] {
                let flat = move |r: UOp| {
                    let r = UOp::new(Op::Reshape(vec![m * n]), DType::F32, vec![r]);
                    r.cast(dtype)
                };
                let body = gemm_body(m, n, k, flat);
                let out = buffer(2, dtype, m * n);
                let program = lower_gemm_epilogue(&body, &out)
                    .expect("a GEMM with an elementwise consumer")
                    .expect("lowers");
                if let Err(e) = uopc_ir::verify(&program) {
                    panic!("({m}, {n}, {k}) {dtype}: {e}");
                }
                let mut bufs =
                    [HostBuffer::F32(a.clone()), HostBuffer::F32(b.clone()), HostBuffer::zeros(dtype, m * n)];
                run(&program, &mut bufs, Precision::Native).expect("runs");
                let got = bufs[2].to_f64_vec();
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    // The exact f32 sum, rounded once to the output type.
                    let w =
                        if dtype == DType::BF16 { half::bf16::from_f32(*w).to_f64() } else { f64::from(*w) };
                    assert_eq!(*g, w, "({m}, {n}, {k}) {dtype}: element {e}");
                }
            }
        }
    }
}
