//! Maps an online group over rows of a loaded input onto the logsumexp tile op: the running
//! maximum and sum of exponentials of a long row at one vector exponential per element.
//!
//! After [`online_reductions`](crate::online_reductions), logsumexp, the normalizer of
//! softmax and log-softmax and cross-entropy's logsumexp all read one online sum
//! `l = sum_j exp2(k (y_j - g(m)))` of the maximum `m = max_j y_j`, with `k > 0`, `g` an
//! elementwise function of `m` (the finite shift of logsumexp, or `m` itself) and `y` an
//! input read in place whose summed axis is contiguous. Rangeify lowers that to a scalar loop
//! over the row; this lowering instead gives each THREAD task a block of rows and calls
//! `TILE_MAX_SUM_EXP` over them, which leaves per row the exact maximum `m` and
//! `L = sum_j exp2(k (y_j - m))`.
//!
//! The algebraic property relied on is the rescaling law of the online rule,
//! `exp2(k (y - g)) = exp2(k (y - m)) exp2(k (m - g))`, so `l = L exp2(k (m - g(m)))` for
//! finite `m`; the lowering evaluates exactly that per row, with the graph's own `g`, and the
//! cases where the factors are not finite as the written sum has them: `g(m) == m` (also
//! `m = -inf`, a row of `-inf`, where the online loop has 0) gives `L`, and `m = +inf`
//! gives `exp2(k (m - g(m)))` (the written sum's infinite term, or its NaN when `g(+inf)` is
//! infinite), where the tile op's `L` is NaN. A NaN in the row makes `m` and `L` NaN, as it
//! makes the written sum. The body (anything computed from `m`, `l` and the input, such as
//! `log l + g(m)` or `y - g(m) - log l`) is evaluated by rangeify with `m` and `l` read from
//! the task's tiles.
//!
//! An elementwise body that computes `exp2(k (y - h))` of the reduced values themselves (the
//! numerator of softmax, the probabilities in the cross-entropy gradient) would pay a second
//! exponential per element in its loop. When exactly one such node is found (see
//! `body_exponential`: `k > 0` constant, `y` the reduced input, the node read only at the
//! body's own element) and `h` is one value per row (checked on the value rangeify gives `h`
//! at the row's elements: it must not depend on the element's range), each task computes a
//! row's exponentials with `TILE_EXP_ROWS` into a row tile, reading the input in place, and
//! the body's loop reads them from there. The tasks then take few enough rows that the second
//! read of a row hits L2, so the input comes from memory once. Otherwise the exponential stays
//! in the body's loop. A group whose sum has another factor (a softmax-weighted sum), whose
//! maximum is of a computed value, or whose rows are not evenly strided is left to rangeify.

mod split;
pub(crate) use split::lower_online_rows_split;

use crate::online::{OnlineSum, shifted_exp2, symbolic_index};
use crate::opt::Opts;
use crate::rangeify::{Ctx, Known};
use crate::tilemap::{Affine, affine};
use crate::util::{dense_strides, largest_divisor_at_most, numel};
use crate::view::{movement_source_index, unravel};
use std::collections::HashSet;
use uopc_ir::{AxisType, DType, Op, ReduceOp, TileOp, UOp, buffer, f32c, idx, range, simplify, sink, tile};

/// Most rows per THREAD task: a task's state is two floats per row, so this only bounds how
/// unevenly tasks can finish.
const MAX_ROWS: usize = 64;
/// THREAD tasks wanted per core, so uneven finishing times even out.
const TASKS_PER_CORE: usize = 4;
/// Bytes of input rows one THREAD task may span when its body reads them a second time
/// (through [`TILE_EXP_ROWS`](TileOp::ExpRows)): well inside a core's L2 (1 MiB on the targets
/// in mind) next to the row of exponentials and the output being written, so the second read
/// hits L2 and the input comes from memory once.
const L2_ROWS_BYTES: usize = 384 * 1024;
/// Most bytes of the per-task row of exponentials: it lives on the worker's stack (see
/// `uopc_jit::MAX_LOCAL_BYTES`), which also holds the task's row state.
const SCRATCH_BYTES: usize = 128 * 1024;

/// An exponential the body computes of the reduced row itself, taken on `TILE_EXP_ROWS`.
struct BodyExp {
    /// The node `exp2(k (y - h))`, with `y` the reduced input at the body's own index.
    node: UOp,
    /// `h`, which must not vary along the row (checked where it is evaluated).
    shift: UOp,
    /// `k`.
    base2: f32,
}

/// The nodes `body` computes itself, not following `stop` (whose values come from tiles).
fn computed_nodes(body: &UOp, stop: &[&UOp]) -> Vec<UOp> {
    let mut seen = HashSet::new();
    let mut todo = vec![body.clone()];
    let mut out = Vec::new();
    while let Some(u) = todo.pop() {
        if stop.contains(&&u) || !seen.insert(u.clone()) {
            continue;
        }
        todo.extend(u.src().iter().cloned());
        out.push(u);
    }
    out
}

/// The exponential of an elementwise body worth a tile op (softmax's numerator, the
/// cross-entropy gradient's probabilities): the one node `exp2(k (y - h))` with `k > 0` a
/// constant and `y` the reduced values at the node's own index, which the body reads only at
/// its own element, so that a task can compute each of its rows' exponentials into a row tile
/// before the body's loop reads them there. `None` (the body keeps its loop exponential) for a
/// body of rows, a second such node, an exponential read at another element, or rows too long
/// for the row tile.
fn body_exponential(body: &UOp, g: &Rows) -> Option<BodyExp> {
    if body.shape() != g.values.shape() || g.cols * 4 > SCRATCH_BYTES {
        return None;
    }
    let mut found = computed_nodes(body, &[&g.max, &g.sum]).into_iter().filter_map(|u| {
        let (t, h, k) = shifted_exp2(&u)?;
        (t == g.values && u.shape() == g.values.shape()).then(|| (u.clone(), h, k))
    });
    let (node, shift, k) = found.next()?;
    if found.next().is_some() {
        return None;
    }
    let index = symbolic_index(body.shape());
    let opaque = [&g.max, &g.sum];
    if !reads_at_own_row(body, &index, &[&node], &opaque, &index, &mut HashSet::new()) {
        return None;
    }
    Some(BodyExp { node, shift, base2: k.const_value()?.as_f64() as f32 })
}

/// What the tile program needs from a matched group.
struct Rows {
    /// The input whose rows are reduced, read in place.
    input: Affine,
    /// Rows (the product of the leading axes) and the length of each.
    rows: usize,
    cols: usize,
    /// Elements from one row's start to the next one's.
    ld: usize,
    /// The reduced values `y` (the maximum's input, read from `input`).
    values: UOp,
    /// The maximum, the online sum and the sum's `g(m)` and `k`.
    max: UOp,
    sum: UOp,
    shift: UOp,
    base2: f32,
}

/// The stride of the flattened leading axes of `shape` under `strides`, when one stride
/// steps from each row to the next (size-1 axes do not count), or `cols` with one row.
fn row_stride(shape: &[usize], strides: &[usize], cols: usize) -> Option<usize> {
    let lead: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .take(shape.len() - 1)
        .filter(|(s, _)| **s > 1)
        .map(|(&s, &t)| (s, t))
        .collect();
    let Some(&(_, ld)) = lead.last() else { return Some(cols) };
    lead.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0).then_some(ld)
}

/// The group `body` computes, if its one online sum is the plain exponential of an input's
/// rows (see the module docs).
fn matched(body: &UOp) -> Option<Rows> {
    if body.dtype() != DType::F32 {
        return None;
    }
    let topo = UOp::toposort(std::slice::from_ref(body));
    let sums: Vec<&UOp> = topo.iter().filter(|u| OnlineSum::of(u).is_some()).collect();
    let [sum] = &sums[..] else { return None };
    let o = OnlineSum::of(sum)?;
    let max = o.max.as_reduce().filter(|r| r.op == ReduceOp::Max && r.axes == 1)?;
    let y = max.input.clone();
    // The summand is the exponential alone, of `k (y - h)` with `y` the maximum's own input at
    // the summand's own index.
    let (t, _, k) = shifted_exp2(&o.summand)?;
    if t != y || o.summand.shape() != y.shape() || sum.as_reduce()?.axes != 1 {
        return None;
    }
    let shape = y.shape().to_vec();
    let input = affine(&y, &shape)?;
    let cols = *shape.last()?;
    if input.dtype != DType::F32 || (cols > 1 && input.strides[shape.len() - 1] != 1) {
        return None;
    }
    let ld = row_stride(&shape, &input.strides, cols)?;
    // Rows on two or more axes of size > 1: a task's tiles would be indexed by the quotient
    // and remainder of its rows, whose difference from the task's first row the verifier
    // cannot bound, so the kernel would not compile; rangeify's loops take those.
    if shape[..shape.len() - 1].iter().filter(|&&s| s > 1).count() > 1 {
        return None;
    }
    // The body's elements are the rows' (a logsumexp) or the input's (a log-softmax), and it
    // reads each row's state only at its own row: a THREAD task holds its rows' state alone.
    if body.shape() != o.max.shape() && body.shape() != &shape[..] {
        return None;
    }
    let index = symbolic_index(body.shape());
    let own_row = index[..o.max.shape().len()].to_vec();
    if !reads_at_own_row(body, &index, &[&o.max, sum], &[], &own_row, &mut HashSet::new()) {
        return None;
    }
    Some(Rows {
        input,
        rows: numel(&shape[..shape.len() - 1]),
        cols,
        ld,
        values: y.clone(),
        max: o.max.clone(),
        sum: (*sum).clone(),
        shift: o.shift.clone(),
        base2: k.const_value()?.as_f64() as f32,
    })
}

/// Whether `u` read at `index` reads each of `targets` only at `row` (symbolic indices,
/// compared once simplified): movement ops move the index as rangeify would, ALU ops read
/// their operands at their own index, a REDUCE reads its input over fresh ranges of the
/// reduced axes, a leaf reads nothing, and any other node is taken to read elsewhere. The
/// nodes `opaque` are not followed: the lowering reads their values from tiles.
fn reads_at_own_row(
    u: &UOp,
    index: &[UOp],
    targets: &[&UOp],
    opaque: &[&UOp],
    row: &[UOp],
    seen: &mut HashSet<(UOp, Vec<UOp>)>,
) -> bool {
    if !seen.insert((u.clone(), index.to_vec())) {
        return true;
    }
    if opaque.contains(&u) {
        return true;
    }
    if targets.contains(&u) {
        // an axis of size 1 has the one index 0, however it is spelled
        let shape = u.shape();
        return index.len() == row.len()
            && index.iter().zip(row).zip(shape).all(|((i, r), &s)| s == 1 || simplify(i) == *r);
    }
    if let Some(viewed) = u.as_movement() {
        let inner: Vec<UOp> = movement_source_index(u, index).iter().map(simplify).collect();
        return reads_at_own_row(viewed, &inner, targets, opaque, row, seen);
    }
    if let Some(r) = u.as_reduce() {
        let mut inner = index.to_vec();
        let reduced = &r.input.shape()[r.input.shape().len() - r.axes..];
        // ids apart from the body's symbolic ranges and from any enclosing reduce's
        let fresh = |k: usize, s: usize| range(s.max(1), usize::MAX - 1024 - index.len() - k, AxisType::Loop);
        inner.extend(reduced.iter().enumerate().map(|(k, &s)| fresh(k, s)));
        return reads_at_own_row(r.input, &inner, targets, opaque, row, seen);
    }
    match u.op() {
        // a 0-d operand is the same value at every index: it is read at its own, empty one
        op if op.is_alu() || matches!(op, Op::Detach) => u.src().iter().all(|s| {
            let at = if s.shape().is_empty() { &[][..] } else { index };
            reads_at_own_row(s, at, targets, opaque, row, seen)
        }),
        // a leaf reads nothing; anything else with sources (a STACK choosing among them by the
        // index, say) is not followed, so it counts as reading elsewhere
        _ => u.src().is_empty(),
    }
}

/// Rows per THREAD task: a divisor of `rows` of at most `most` (and [`MAX_ROWS`]), halved
/// while there are fewer than [`TASKS_PER_CORE`] tasks per core.
fn rows_per_task(rows: usize, most: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut br = largest_divisor_at_most(rows, MAX_ROWS.min(most.max(1)));
    while rows / br < TASKS_PER_CORE * cores && br > 1 {
        br = largest_divisor_at_most(rows, br / 2);
    }
    br
}

/// The tile-op program of kernel `body` writing `out`, or `None` when `body` is not a function
/// of an online group over the rows of an input (see the module docs).
pub(crate) fn lower_online_rows(body: &UOp, out: &UOp) -> Option<UOp> {
    lower_online_rows_together(&[(body.clone(), out.clone())])
}

/// One program for kernels that all read the same online group (the same maximum and online
/// sum of the same input's rows), each `(body, out)` writing its own output: every THREAD task computes its rows' maximum and
/// sum once, then evaluates each body over those rows in turn, so the rows come from memory
/// once for all of them. The tasks take the fewest rows any body wants. `None` when a body
/// does not match or reads another group.
pub(crate) fn lower_online_rows_together(kernels: &[(UOp, UOp)]) -> Option<UOp> {
    let (first, _) = kernels.first()?;
    let g = matched(first).filter(|g| g.rows > 0)?;
    let mut exps = Vec::with_capacity(kernels.len());
    for (body, _) in kernels {
        let own = matched(body)?;
        if own.max != g.max || own.sum != g.sum {
            return None;
        }
        exps.push(body_exponential(body, &g));
    }
    // A body reading the rows again wants them in L2 still.
    let most = if exps.iter().any(Option::is_some) { L2_ROWS_BYTES / (4 * g.cols) } else { MAX_ROWS };
    let br = rows_per_task(g.rows, most);
    let f32t = DType::F32;
    let mut cx = Ctx::new(Opts::default(), true);
    let (mx, raw, sum) = (cx.fresh_alloc(f32t, br), cx.fresh_alloc(f32t, br), cx.fresh_alloc(f32t, br));
    let t = cx.fresh_range(g.rows / br, AxisType::Thread, &[]);
    let th = std::slice::from_ref(&t);
    let row0 = &t * br as i64;
    let (mi, ri) = (mx.after(th), raw.after(th));
    let r = cx.fresh_range(br, AxisType::Loop, th);
    let init = sink(&[mi.index(&r).store(f32c(f32::NEG_INFINITY)), ri.index(&r).store(0.0f32)]).end(&[r]);
    let x = buffer(g.input.slot, g.input.dtype, g.input.len);
    let first = &row0 * g.ld as i64 + g.input.base as i64;
    let after_init = std::slice::from_ref(&init);
    let step = TileOp::MaxSumExp { rows: br, cols: g.cols, ld: g.ld, scale: g.base2.to_bits() };
    let lse = tile(step, &[x.index(&first), mi.after(after_init).index(0), ri.after(after_init).index(0)]);
    let state = RowState {
        max: mx.after(std::slice::from_ref(&lse)),
        raw: raw.after(std::slice::from_ref(&lse)),
        sum,
    };
    let window = Window { row0: row0.clone(), rows: br, cols: None, first: None };
    let stores = bodies_over_state(&mut cx, &g, kernels, &exps, &t, &state, &window)?;
    let program = match &stores[..] {
        [(store, ranges)] => store.end(&[&ranges[..], th].concat()),
        _ => sink(&stores.iter().map(|(store, ranges)| store.end(ranges)).collect::<Vec<_>>()).end(th),
    };
    Some(sink(&[program]))
}

/// A task's rows' state once computed: each row's exact maximum `m` and `L = sum_j exp2(k (y_j
/// - m))` (views after the step that wrote them), and the tile for the written sum.
struct RowState {
    max: UOp,
    raw: UOp,
    sum: UOp,
}

/// What one THREAD task writes: `rows` rows from `row0`, and of an elementwise body the
/// columns `start .. start + len` of each (`cols`), or all of them.
struct Window {
    row0: UOp,
    rows: usize,
    cols: Option<(UOp, usize)>,
    /// The output index of the window's first element when it is written as one run from
    /// there (a task of one row's chunk: `t * len`, where `row0 * cols + start` would spell it
    /// with a division and a remainder of `t` that the disjointness proof cannot follow).
    first: Option<UOp>,
}

/// The stores of each `(body, out)` of `kernels` over task `t`'s `window`, from the rows'
/// `state`: the written sum from `L` (see the module docs for each case), then each body, with
/// `m` and the sum read from the task's tiles. Returns each store and the ranges it is inside
/// of within the task, innermost first.
fn bodies_over_state(
    cx: &mut Ctx,
    g: &Rows,
    kernels: &[(UOp, UOp)],
    exps: &[Option<BodyExp>],
    t: &UOp,
    state: &RowState,
    window: &Window,
) -> Option<Vec<(UOp, Vec<UOp>)>> {
    let th = std::slice::from_ref(t);
    // The maximum as the body reads it: the task's tile, from the task's first row.
    let max_shape = g.max.shape().to_vec();
    let origin = unravel(&window.row0, &max_shape);
    let strides = dense_strides(&max_shape);
    let known = |buffer: UOp| Known { buffer, origin: origin.clone(), strides: strides.clone() };
    cx.assume(&g.max, known(state.max.clone()));
    let r = cx.fresh_range(window.rows, AxisType::Loop, th);
    let at = unravel(&(&window.row0 + &r), &max_shape);
    let shift = cx.value_at(&g.shift, &at).ok()?;
    let (m, l) = (state.max.index(&r).load(), state.raw.index(&r).load());
    let carried = ((&m - &shift) * g.base2).exp2();
    let written = m.ne(&shift).where_(m.ne(f32::INFINITY).where_(&l * &carried, &carried), &l);
    let fixed = state.sum.after(th).index(&r).store(written).end(&[r]);
    cx.assume(&g.sum, known(state.sum.after(std::slice::from_ref(&fixed))));
    let mut stores = Vec::with_capacity(kernels.len());
    for ((body, out), exp) in kernels.iter().zip(exps) {
        stores.push(body_over_rows(cx, body, out, exp.as_ref(), g, t, window)?);
    }
    Some(stores)
}

/// Kernel `body` written to `out` at each of THREAD task `t`'s output elements (the rows of
/// its `window`, or their elements in its columns), with the rows' state already assumed in
/// `cx`; the body's exponential `exp`, when there is one, is computed per row into a row tile
/// first. Returns the store and the ranges it is inside of within the task, innermost first.
fn body_over_rows(
    cx: &mut Ctx,
    body: &UOp,
    out: &UOp,
    exp: Option<&BodyExp>,
    g: &Rows,
    t: &UOp,
    window: &Window,
) -> Option<(UOp, Vec<UOp>)> {
    let f32t = DType::F32;
    let th = std::slice::from_ref(t);
    let row0 = &window.row0;
    let (col0, width) = window.cols.clone().unwrap_or((idx(0), g.cols));
    let max_shape = g.max.shape().to_vec();
    let x = buffer(g.input.slot, g.input.dtype, g.input.len);
    let r = cx.fresh_range(window.rows, AxisType::Loop, th);
    let mut at = unravel(&(row0 + &r), &max_shape);
    let (flat, ranges) = if body.shape() == &max_shape[..] {
        (row0 + &r, vec![r])
    } else {
        let e = cx.fresh_range(width, AxisType::Loop, &[t.clone(), r.clone()]);
        let col = &col0 + &e;
        at.push(col.clone());
        let flat = match &window.first {
            Some(first) => first + &r * g.cols as i64 + &e,
            None => (row0 + &r) * g.cols as i64 + &col,
        };
        (flat, vec![e, r])
    };
    // The property relied on: `h` is one value per row (its value at the row's elements does
    // not depend on the element), so one shift serves the row. Checked on the value rangeify
    // gives it; a shift that varies keeps the body's exponential in its loop.
    let row_shift = exp.and_then(|exp| {
        let shift = cx.value_at(&exp.shift, &at).ok()?;
        (!UOp::toposort(std::slice::from_ref(&shift)).contains(&ranges[0])).then_some((exp, shift))
    });
    // Inside the task even when it is the one task of one row, which the index does not
    // show (loops of one iteration simplify away): a reduce in the body accumulates per task.
    // Likewise inside the row when the body reads the row tile, which is written per row:
    // a reduce whose index lost the row (one row, one column) must not be hoisted above it.
    let mut body_loops = vec![t.clone()];
    if let Some((exp, shift)) = row_shift {
        // The row's exponentials into a row tile, then the body reads them there.
        let r = &ranges[1];
        let (shift_tile, row_tile) = (cx.fresh_alloc(f32t, 1), cx.fresh_alloc(f32t, width));
        // declared per task (the THREAD range) and written per row
        let within = &[t.clone(), r.clone()][..];
        let set = shift_tile.after(within).index(0).store(shift);
        let op = TileOp::ExpRows { rows: 1, cols: width, ldx: g.ld, ldy: width, scale: exp.base2.to_bits() };
        let row_start = (row0 + r) * g.ld as i64 + &col0 + g.input.base as i64;
        let ys = tile(
            op,
            &[
                x.index(&row_start),
                shift_tile.after(std::slice::from_ref(&set)).index(0),
                row_tile.after(within).index(0),
            ],
        );
        let mut origin = at.clone();
        *origin.last_mut()? = col0.clone();
        let mut strides = vec![0; origin.len()];
        *strides.last_mut()? = 1;
        cx.assume(&exp.node, Known { buffer: row_tile.after(std::slice::from_ref(&ys)), origin, strides });
        body_loops.push(r.clone());
    }
    let value = cx.value_within(body, &at, &body_loops).ok()?;
    Some((out.index(flat).store(value), ranges))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_step_by_one_stride_or_not_at_all() {
        assert_eq!(row_stride(&[4, 8], &[8, 1], 8), Some(8));
        assert_eq!(row_stride(&[4, 8], &[10, 1], 8), Some(10), "padded rows");
        assert_eq!(row_stride(&[2, 3, 8], &[24, 8, 1], 8), Some(8), "leading axes flatten");
        assert_eq!(row_stride(&[2, 3, 8], &[32, 8, 1], 8), None, "a gap between the outer rows");
        assert_eq!(row_stride(&[1, 8], &[0, 1], 8), Some(8), "one row");
        assert_eq!(row_stride(&[8], &[1], 8), Some(8));
    }

    #[test]
    fn tasks_divide_the_rows() {
        for rows in [1, 7, 64, 256, 1000] {
            let br = rows_per_task(rows, MAX_ROWS);
            assert!((1..=MAX_ROWS).contains(&br) && rows % br == 0, "{rows}: {br}");
        }
    }
}
