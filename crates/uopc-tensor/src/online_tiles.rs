//! Maps an online group whose scores are a matrix product onto tile ops: the structure of
//! FlashAttention-2 reached from the rewritten graph instead of written by hand.
//!
//! After [`online_reductions`](crate::online_reductions), a softmax-weighted sum of a product
//! reads `O / l` with `O = sum_j exp2(k (s_j - m)) v_j` and `l = sum_j exp2(k (s_j - m))` online
//! sums of one maximum `m = max_j s_j`, and `s = c * (A B)` a GEMM over two strided inputs. Rangeify
//! lowers that to one loop over the keys with scalar accumulators; this lowering instead keeps a
//! block of rows per THREAD task and, per block of keys, computes the scores with a tile GEMM,
//! scales them to base 2, applies the online-softmax tile update (running max and sum, `O`
//! rescaled once per block) and adds `P V` with a second tile GEMM; the score and output tiles
//! live on the stack, and the body is stored once at the end. What surrounds the two products
//! is read off the graph by rangeify: the scores' own elementwise function of the product (a
//! mask `where(keep, s, -inf)`, an additive bias, a scale) is evaluated on each score tile
//! before the update, and the body's function of `O` and `l` (the division, a row indicator)
//! when the output is stored. A group whose values are not inputs read in place, or whose body
//! reads the scores other than through the two sums, is left to rangeify.

use crate::online::OnlineSum;
use crate::opt::Opts;
use crate::rangeify::{Ctx, Known};
use crate::tilemap::{Affine, affine, batch_offset, gemm_operands, layout};
use crate::util::largest_divisor_at_most;
use crate::view::movement_chain;
use std::collections::HashSet;
use uopc_ir::{
    AxisType, BinaryOp, DType, GemmShape, Op, TileOp, UOp, UnaryOp, buffer, f32c, guard_end, guard_exact_end,
    idx, linear_in, simplify, sink, tile,
};

/// Keys per block: one score tile row spans this many keys.
const KEY_BLOCK: usize = 128;
/// Most query rows per THREAD task (the score GEMM packs each key block once per task).
const MAX_ROWS: usize = 256;
/// Most bytes of a task's tiles (scores, output, running max and sum), which live on the stack
/// of a worker thread (the JIT allows 256 KiB of ALLOCs) and are reread every key block, so
/// should stay in L2.
const TILE_BYTES: usize = 192 * 1024;
/// Fewest rows per task when tasks are split for more parallelism.
const MIN_ROWS: usize = 32;
/// THREAD tasks wanted per core, so uneven finishing times even out.
const TASKS_PER_CORE: usize = 4;

/// A strided input operand of one of the two products, with its layout for the tile GEMM.
struct Operand {
    view: Affine,
    trans: bool,
    ld: usize,
}

/// What the tile program needs from a matched group.
struct Attention {
    batch: Vec<usize>,
    n_q: usize,
    n_k: usize,
    d: usize,
    dv: usize,
    q: Operand,
    k: Operand,
    v: Operand,
    /// Stride of Q along the query rows, K and V along the keys.
    q_row: usize,
    k_row: usize,
    v_row: usize,
    /// The online sums `O` (over `[batch.., n_q, dv]`) and `l` (over `[batch.., n_q]`).
    sum: UOp,
    norm: UOp,
    /// The scores `s` (the maximum's input) and the product they are a function of.
    scores: UOp,
    product: UOp,
    /// `k` of `exp2(k * (s - m))`.
    base2: f32,
}

fn base(u: &UOp) -> UOp {
    movement_chain(u).1
}

/// `u` as a product of two factors, either order.
fn mul_pair(u: &UOp) -> Option<(UOp, UOp)> {
    let Some((BinaryOp::Mul, a, b)) = u.as_binary() else { return None };
    Some((a.clone(), b.clone()))
}

/// The nodes `root` reads, not looking past the nodes in `stop`.
fn reads_until(root: &UOp, stop: &[&UOp]) -> HashSet<UOp> {
    let mut seen = HashSet::new();
    let mut todo = vec![root.clone()];
    while let Some(u) = todo.pop() {
        if !seen.insert(u.clone()) || stop.contains(&&u) {
            continue;
        }
        todo.extend(u.src().iter().cloned());
    }
    seen
}

/// The product the scores are an elementwise function of: the one REDUCE they read, a GEMM of
/// two inputs over the scores' own index space, every other leaf an input or a constant.
fn score_product(scores: &UOp) -> Option<UOp> {
    let mut product = None;
    for u in reads_until(scores, &[]) {
        match u.op() {
            Op::Reduce { .. } if product.is_none() => product = Some(u),
            Op::Reduce { .. } | Op::Custom(_) | Op::Stage => return None,
            _ => {}
        }
    }
    let product = product?;
    // Nothing between the scores and the product may move the index.
    let moved = reads_until(scores, &[&product])
        .iter()
        .any(|u| u.op().is_movement() && reads_until(u, &[]).contains(&product));
    (!moved && product.shape() == scores.shape()).then_some(product)
}

/// The group `body` computes, if it is a function of `O` and `l` of an online group over a
/// matrix product (see the module docs).
fn matched(body: &UOp) -> Option<Attention> {
    if body.dtype() != DType::F32 {
        return None;
    }
    let sums: Vec<UOp> = UOp::toposort(std::slice::from_ref(body))
        .into_iter()
        .filter(|u| OnlineSum::of(u).is_some())
        .collect();
    let [a, b] = &sums[..] else { return None };
    let (oa, ob) = (OnlineSum::of(a)?, OnlineSum::of(b)?);
    // l sums the exponential alone; O sums it times the value.
    let ((sum, o), (norm, l)) = if oa.summand.shape().len() > ob.summand.shape().len() {
        ((a, oa), (b, ob))
    } else {
        ((b, ob), (a, oa))
    };
    if o.max != l.max || o.shift != o.max || l.shift != l.max {
        return None;
    }
    let (f1, f2) = mul_pair(&o.summand)?;
    let (e_view, v_view) =
        if matches!(base(&f1).op(), Op::Unary(UnaryOp::Exp2)) { (f1, f2) } else { (f2, f1) };
    let e = base(&e_view);
    if base(&l.summand) != e {
        return None;
    }
    let (t, h, k) = crate::online::shifted_exp2(&e)?;
    let scores = o.max.as_reduce()?.input.clone();
    if base(&t) != scores || base(&h) != o.max {
        return None;
    }
    let product = score_product(&scores)?;
    // The body reads the scores only through the two sums.
    let outside = reads_until(body, &[sum, norm]);
    if outside.contains(&o.max) || outside.contains(&product) {
        return None;
    }
    let ops = gemm_operands(&product)?;
    if ops.a.dtype != DType::F32 {
        return None;
    }
    let r = ops.shape.len();
    let (n_q, n_k, d) = (ops.shape[r - 3], ops.shape[r - 2], ops.shape[r - 1]);
    let batch = ops.shape[..r - 3].to_vec();
    // The value operand over [batch.., n_q, dv, n_k]: broadcast along the queries.
    let vs = o.summand.shape().to_vec();
    if vs.len() != r || vs[..r - 3] != batch[..] || vs[r - 3] != n_q || vs[r - 1] != n_k {
        return None;
    }
    let dv = vs[r - 2];
    if body.shape() != &vs[..r - 1] || norm.shape() != &vs[..r - 2] {
        return None;
    }
    let v = affine(&v_view, &vs)?;
    if v.dtype != DType::F32 || (n_q > 1 && v.strides[r - 3] != 0) {
        return None;
    }
    let (v_trans, ldv) = layout(n_k, dv, v.strides[r - 1], v.strides[r - 2])?;
    let (q_row, k_row, v_row) = (ops.a.strides[r - 3], ops.b.strides[r - 2], v.strides[r - 1]);
    Some(Attention {
        batch,
        n_q,
        n_k,
        d,
        dv,
        q: Operand { view: ops.a, trans: ops.a_trans, ld: ops.lda },
        k: Operand { view: ops.b, trans: ops.b_trans, ld: ops.ldb },
        v: Operand { view: v, trans: v_trans, ld: ldv },
        q_row,
        k_row,
        v_row,
        sum: sum.clone(),
        norm: norm.clone(),
        scores,
        product,
        base2: k.const_value()?.as_f64() as f32,
    })
}

/// Query rows per THREAD task: a divisor of `n_q` of at most [`MAX_ROWS`] whose tiles (a
/// row of `keys` scores, `dv` outputs, its max and sum) fit [`TILE_BYTES`], halved (down to
/// [`MIN_ROWS`]) while there are fewer than [`TASKS_PER_CORE`] tasks per core.
fn rows_per_task(n_q: usize, keys: usize, dv: usize, items: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let cap = (TILE_BYTES / (4 * (keys + dv + 2))).clamp(1, MAX_ROWS);
    let mut rows = largest_divisor_at_most(n_q, cap);
    while items * (n_q / rows) < TASKS_PER_CORE * cores && rows / 2 >= MIN_ROWS {
        rows = largest_divisor_at_most(n_q, rows / 2);
    }
    rows
}

/// The coordinates of batch item `item` (a flat index over `batch`, last axis fastest).
fn batch_coords(item: &UOp, batch: &[usize]) -> Vec<UOp> {
    let mut coords = vec![idx(0); batch.len()];
    let mut rest = item.clone();
    for (a, &size) in batch.iter().enumerate().rev() {
        if size > 1 {
            coords[a] = rest.modulo(size as i64);
        }
        rest = rest.idiv(size as i64);
    }
    coords
}

/// The score GEMM of `rows` query rows against a block of `cols` keys: `S = Q K^T`, over
/// the views `a` matched, into a dense `rows x cols` tile.
fn score_gemm(a: &Attention, rows: usize, cols: usize) -> TileOp {
    let dense = GemmShape::dense(rows, cols, a.d, a.q.trans, a.k.trans, false);
    TileOp::Gemm(GemmShape { lda: a.q.ld, ldb: a.k.ld, ..dense })
}

/// The `P V` GEMM of a `rows x cols` probability tile against that block's values,
/// accumulated into the dense `rows x dv` output tile.
fn pv_gemm(a: &Attention, rows: usize, cols: usize) -> TileOp {
    TileOp::Gemm(GemmShape { ldb: a.v.ld, ..GemmShape::dense(rows, a.dv, cols, false, a.v.trans, true) })
}

/// The tile-op program of kernel `body` writing `out`, or `None` when `body` is not a function
/// of an online group over a matrix product (see the module docs).
pub(crate) fn lower_online_attention(body: &UOp, out: &UOp) -> Option<UOp> {
    let a = matched(body)?;
    let items: usize = a.batch.iter().product();
    let bc = KEY_BLOCK.min(a.n_k);
    let br = rows_per_task(a.n_q, bc, a.dv, items);
    let (blocks_per_item, f32t) = (a.n_q / br, DType::F32);
    let mut cx = Ctx::new(Opts::default(), true);
    let (s, o, mx, l) = (
        cx.fresh_alloc(f32t, br * bc),
        cx.fresh_alloc(f32t, br * a.dv),
        cx.fresh_alloc(f32t, br),
        cx.fresh_alloc(f32t, br),
    );
    let t = cx.fresh_range(items * blocks_per_item, AxisType::Thread, &[]);
    let th = std::slice::from_ref(&t);
    let (si, oi, mi, li) = (s.after(th), o.after(th), mx.after(th), l.after(th));
    let z = cx.fresh_range(br * a.dv, AxisType::Loop, th);
    let init_o = oi.index(&z).store(0.0f32).end(&[z]);
    let rr = cx.fresh_range(br, AxisType::Loop, th);
    let init_ml =
        sink(&[mi.index(&rr).store(f32c(f32::NEG_INFINITY)), li.index(&rr).store(0.0f32)]).end(&[rr]);
    let (item, block) = (t.idiv(blocks_per_item as i64), t.modulo(blocks_per_item as i64));
    let coords = batch_coords(&item, &a.batch);
    let row0 = &block * br as i64;
    let start = |x: &Affine| batch_offset(&item, &a.batch, &x.strides) + x.base as i64;
    let q_first = start(&a.q.view) + &block * (br * a.q_row);
    let (k_first, v_first) = (start(&a.k.view), start(&a.v.view));
    let buf = |x: &Affine| buffer(x.slot, x.dtype, x.len);
    let (qb, kb, vb) = (buf(&a.q.view), buf(&a.k.view), buf(&a.v.view));
    let task = Task { coords: coords.clone(), row0: row0.clone(), rows: br };
    // Scores that are the product times a positive constant need no pass of their own: the
    // update applies the factor, in base 2, as it reads them.
    let factor = constant_factor(&a);
    // One key block of `cols` keys from key `first`, inside the loops `outer`: scores, their
    // function in base 2, the update, P V.
    // `prefix`: the mask is exactly a prefix of each row's keys (see `masked_suffixes`).
    let key_block = |cx: &mut Ctx,
                     first: &UOp,
                     cols: usize,
                     prev: &[UOp],
                     outer: &[UOp],
                     prefix: bool|
     -> Option<UOp> {
        let g1 = tile(
            score_gemm(&a, br, cols),
            &[qb.index(&q_first), kb.index(&k_first + first * a.k_row as i64), si.after(prev).index(0)],
        );
        let tile_s = si.after(std::slice::from_ref(&g1));
        let mut state = prev.to_vec();
        let scale = match factor.filter(|_| !prefix) {
            Some(factor) => {
                state.push(g1.clone());
                factor
            }
            None => {
                let scaled = match a.scores.as_where().filter(|_| prefix) {
                    // the unmasked scores on the whole tile (a vectorized loop), then -inf over
                    // each row's masked suffix
                    Some(w) => {
                        let plain = scores_on_tile(cx, &a, &task, (&tile_s, w.then), first, cols, outer)?;
                        masked_suffixes(cx, &a, &task, &si.after(&[g1.clone(), plain]), first, cols, outer)?
                    }
                    None => scores_on_tile(cx, &a, &task, (&tile_s, &a.scores), first, cols, outer)?,
                };
                state.push(scaled);
                1.0
            }
        };
        let update =
            TileOp::SoftmaxUpdate { rows: br, cols, lds: cols, d: a.dv, ldo: a.dv, scale: scale.to_bits() };
        let scores_ready = &state[state.len() - 1..];
        let sm = tile(
            update,
            &[
                si.after(scores_ready).index(0),
                mi.after(&state).index(0),
                li.after(&state).index(0),
                oi.after(&state).index(0),
            ],
        );
        let after_sm = std::slice::from_ref(&sm);
        Some(tile(
            pv_gemm(&a, br, cols),
            &[
                si.after(after_sm).index(0),
                vb.index(&v_first + first * a.v_row as i64),
                oi.after(after_sm).index(0),
            ],
        ))
    };
    let full = a.n_k / bc;
    // Key blocks past every key the task's rows can see are skipped; at least one block runs,
    // so a task whose rows see no key ends in the state a fully masked block leaves.
    let seen = visible_keys(&mut cx, &a, &task, &t, body);
    let blocks = seen.as_ref().map_or(idx(full as i64), |v| v.full_blocks(full, bc));
    // simplified now: rangeify simplifies the indices it reads at, and a RANGE whose end it
    // rewrote would be another node
    let j = cx.fresh_range(simplify(&blocks), AxisType::Reduce, th);
    let prefix = seen.as_ref().is_some_and(|v| v.prefix);
    let deps = [init_o, init_ml, j.clone()];
    let mut done =
        key_block(&mut cx, &(&j * bc), bc, &deps, &[t.clone(), j.clone()], prefix)?.end(&[j.clone()]);
    if a.n_k % bc != 0 {
        let first = idx((full * bc) as i64);
        done = match &seen {
            None => key_block(&mut cx, &first, a.n_k % bc, &[done], th, false)?,
            Some(v) => {
                // the partial last block, when some row sees into it: a loop of 0 or 1 trips
                let runs = min_index(&idx(1), &(&v.end - (full * bc) as i64).maximum(0));
                let tail = cx.fresh_range(simplify(&runs), AxisType::Reduce, th);
                let deps = [done, tail.clone()];
                key_block(&mut cx, &first, a.n_k % bc, &deps, &[t.clone(), tail.clone()], v.prefix)?
                    .end(&[tail])
            }
        };
    }
    // The body at each output element, O and l read from the task's tiles.
    let after = std::slice::from_ref(&done);
    store_body(&mut cx, &a, &task, body, out, (&oi.after(after), &li.after(after)), &t)
}

/// The smaller of two index expressions, written so value bounds see it (the bound of a
/// WHERE would be the larger of its arms').
fn min_index(a: &UOp, b: &UOp) -> UOp {
    -(-a).maximum(-b)
}

/// The keys the rows of `task` can see, when the scores are `where(keep, x, masked)` and `keep`'s
/// end along the keys can be read off its loop form (see [`guard_end`]); `None` when the scores
/// have another form or `keep` gives no end.
///
/// Key blocks past the end are skipped, which is exact when `masked` is `-inf` (such a score
/// changes neither the running maximum nor the sums). A finite `masked` score (at most
/// [`MASKED_AT_MOST`]) adds nothing to a row that sees some key, but a row that sees none
/// averages the values of the keys it runs over, so then the body must zero such rows: it is a
/// product with the row indicator `max_j keep` (what [`masked`](crate::masked) builds).
fn visible_keys(cx: &mut Ctx, a: &Attention, task: &Task, t: &UOp, body: &UOp) -> Option<Visible> {
    let w = a.scores.as_where()?;
    let masked = base(w.otherwise).const_value()?.as_f64();
    let exact = masked == f64::NEG_INFINITY || (masked <= MASKED_AT_MOST && zeroes_unseen_rows(body, w.cond));
    if !exact || reads_until(w.cond, &[]).contains(&a.product) {
        return None;
    }
    let th = std::slice::from_ref(t);
    let row = cx.fresh_range(task.rows, AxisType::Loop, th);
    let (key, keep) = keep_at(cx, a, task, w.cond, &row, th)?;
    // the latest row's end, when the end moves monotonically with the row
    let (coef, rest) = linear_in(&simplify(&guard_end(&keep, &key)?), &row)?;
    let end = simplify(&if coef > 0 { rest + coef * (task.rows as i64 - 1) } else { rest });
    let prefix = guard_exact_end(&keep, &key).and_then(|e| linear_in(&simplify(&e), &row)).is_some();
    Some(Visible { end, prefix })
}

/// The scores' mask condition `cond` at the task's row `row` and a fresh key variable (a RANGE
/// over the keys inside `enclosing`, never emitted: it only stands for the key in the loop
/// expression), as `(key, condition)`, for the guard analyses to read.
fn keep_at(
    cx: &mut Ctx,
    a: &Attention,
    task: &Task,
    cond: &UOp,
    row: &UOp,
    enclosing: &[UOp],
) -> Option<(UOp, UOp)> {
    let key = cx.fresh_range(a.n_k, AxisType::Loop, enclosing);
    let mut at = task.coords.clone();
    at.extend([&task.row0 + row, key.clone()]);
    Some((key.clone(), simplify(&cx.value_at(cond, &at).ok()?)))
}

/// The keys a THREAD task's rows see (see [`visible_keys`]).
struct Visible {
    /// Past this key no row sees any.
    end: UOp,
    /// Whether each row sees exactly the keys before an end that is linear in the row.
    prefix: bool,
}

impl Visible {
    /// How many of the `full` key blocks of `bc` keys the task runs: up to the one holding
    /// `end`, and at least one.
    fn full_blocks(&self, full: usize, bc: usize) -> UOp {
        let holding_end = (self.end.maximum(0) + (bc as i64 - 1)).idiv(bc as i64);
        min_index(&idx(full as i64), &holding_end.maximum(1))
    }
}

/// The largest finite masked score that adds exactly nothing to a row that sees a key:
/// `exp2(k (masked - max))` underflows to 0 for any realistic maximum.
const MASKED_AT_MOST: f64 = -1.0e30;

/// Whether `body` is a product (through views) with a factor `max_j keep` over the keys, for
/// the condition `cond = keep != 0`: zero on every row whose keys are all masked.
fn zeroes_unseen_rows(body: &UOp, cond: &UOp) -> bool {
    let Some((BinaryOp::CmpNe, x, zero)) = cond.as_binary() else { return false };
    if base(zero).const_value().map(|c| c.as_f64()) != Some(0.0) {
        return false;
    }
    let keep = base(x);
    let mut factors = vec![base(body)];
    while let Some(f) = factors.pop() {
        if let Some((BinaryOp::Mul, l, r)) = f.as_binary() {
            factors.extend([base(l), base(r)]);
        } else if f
            .as_reduce()
            .is_some_and(|r| (r.op, r.axes) == (uopc_ir::ReduceOp::Max, 1) && base(r.input) == keep)
        {
            return true;
        }
    }
    false
}

/// Where a THREAD task's block of query rows is: its batch coordinates, its first row and its
/// row count.
struct Task {
    coords: Vec<UOp>,
    row0: UOp,
    rows: usize,
}

/// For scores `where(keep, x, -inf)` whose `keep` is exactly "key below an end of the row" (see
/// [`guard_exact_end`]), the masked score over each row's masked suffix of the tile `tile_s` of `cols` keys
/// from `first`, after its unmasked scores were written: per row, a loop over the masked keys
/// only, run from the tile row's end so its bounds are the row's.
fn masked_suffixes(
    cx: &mut Ctx,
    a: &Attention,
    task: &Task,
    tile_s: &UOp,
    first: &UOp,
    cols: usize,
    outer: &[UOp],
) -> Option<UOp> {
    let w = a.scores.as_where()?;
    let ri = cx.fresh_range(task.rows, AxisType::Loop, outer);
    let inner: Vec<UOp> = outer.iter().cloned().chain([ri.clone()]).collect();
    let (key, keep) = keep_at(cx, a, task, w.cond, &ri, &inner)?;
    let end = guard_exact_end(&keep, &key)?;
    let seen = min_index(&idx(cols as i64), &(end - first).maximum(0));
    let c = cx.fresh_range(simplify(&(idx(cols as i64) - seen)), AxisType::Loop, &inner);
    let at_c = &ri * cols as i64 + (cols as i64 - 1) - &c;
    // the masked score as the graph gives it, in base 2 like the others
    let masked = base(w.otherwise).const_value()?.as_f64() as f32 * a.base2;
    Some(tile_s.after(std::slice::from_ref(&ri)).index(at_c).store(f32c(masked)).end(&[c, ri]))
}

/// The factor the softmax update applies to the raw products when the scores are the product
/// itself or the product times a positive finite constant `c` (the usual `1/sqrt(D)`): `k c`,
/// with `k` the base-2 factor, rounded once where a pass over the tile would round `c s` and
/// then `k (c s)`. `None` for a mask, a bias, or any other function of the product: those are
/// evaluated on the tile first. The factor must be positive, since the update keeps a `-inf`
/// score `-inf` only then.
fn constant_factor(a: &Attention) -> Option<f32> {
    let c = if a.scores == a.product {
        1.0
    } else {
        let (x, y) = mul_pair(&a.scores)?;
        let c = match (x == a.product, y == a.product) {
            (true, false) => y,
            (false, true) => x,
            _ => return None,
        };
        base(&c).const_value()?.as_f64()
    };
    let factor = (c * f64::from(a.base2)) as f32;
    (c > 0.0 && factor.is_finite() && factor > 0.0).then_some(factor)
}

/// The scores' own function of the product (scale, mask, bias, as the graph writes it),
/// evaluated by rangeify on the score tile `tile_s` of `cols` keys from `first` inside the loops
/// `outer` and scaled to base 2 in place: the effect that ends the loops over the tile.
fn scores_on_tile(
    cx: &mut Ctx,
    a: &Attention,
    task: &Task,
    (tile_s, scores): (&UOp, &UOp),
    first: &UOp,
    cols: usize,
    outer: &[UOp],
) -> Option<UOp> {
    let ri = cx.fresh_range(task.rows, AxisType::Loop, outer);
    let inner: Vec<UOp> = outer.iter().cloned().chain([ri.clone()]).collect();
    let ci = cx.fresh_range(cols, AxisType::Loop, &inner);
    let mut origin = task.coords.clone();
    origin.extend([task.row0.clone(), first.clone()]);
    let strides: Vec<usize> = vec![0; a.batch.len()].into_iter().chain([cols, 1]).collect();
    cx.assume(&a.product, Known { buffer: tile_s.clone(), origin, strides });
    let mut at = task.coords.clone();
    at.extend([&task.row0 + &ri, first + &ci]);
    let y = cx.value_at(scores, &at).ok()?;
    Some(tile_s.index(&ri * cols as i64 + &ci).store(y * a.base2).end(&[ci, ri]))
}

/// The stores of `body` at every output element of the task in THREAD iteration `t`, `O` and
/// `l` read from the task's finished output tile and row sums (`tiles`).
fn store_body(
    cx: &mut Ctx,
    a: &Attention,
    task: &Task,
    body: &UOp,
    out: &UOp,
    tiles: (&UOp, &UOp),
    t: &UOp,
) -> Option<UOp> {
    let th = std::slice::from_ref(t);
    let rr = cx.fresh_range(task.rows, AxisType::Loop, th);
    let e = cx.fresh_range(a.dv, AxisType::Loop, &[t.clone(), rr.clone()]);
    let zeros = vec![0usize; a.batch.len()];
    let mut origin = task.coords.clone();
    origin.extend([task.row0.clone(), idx(0)]);
    let o_strides = zeros.iter().copied().chain([a.dv, 1]).collect();
    cx.assume(&a.sum, Known { buffer: tiles.0.clone(), origin: origin.clone(), strides: o_strides });
    origin.pop();
    let l_strides = zeros.iter().copied().chain([1]).collect();
    cx.assume(&a.norm, Known { buffer: tiles.1.clone(), origin, strides: l_strides });
    let mut at = task.coords.clone();
    at.extend([&task.row0 + &rr, e.clone()]);
    let value = cx.value_at(body, &at).ok()?;
    let st = out.index((t * task.rows + &rr) * a.dv + &e).store(value);
    Some(sink(&[st.end(&[e, rr, t.clone()])]))
}
