//! The split form of an online group over few long rows. With fewer rows than the cores want
//! tasks, one task per row (or per block of rows) leaves cores idle, so each row is cut into
//! chunks: a first kernel's THREAD tasks reduce one chunk each to a partial state with
//! `TILE_MAX_SUM_EXP` (the chunk's maximum `m_c` and `L_c = sum_j exp2(k (y_j - m_c))`), and
//! a second kernel merges each row's states and evaluates the body from them, its tasks again
//! taking a chunk of each row's elements when the body is elementwise.
//!
//! The merge is the union of two states (the chapter's merge rule, applied chunk by chunk):
//! with `m = max_c m_c`, `L = sum_c L_c exp2(k (m_c - m))`, which holds because each chunk's
//! terms carry the common factor `exp2(k (m_c - m))` out of their sum (the same rescaling law
//! the one-pass lowering relies on, see the parent module). A chunk whose maximum is `-inf`
//! (all its values `-inf`) weighs 0 outright, since `-inf - -inf` would be NaN, so a row of
//! `-inf` keeps `L = 0` as the one-pass step gives it; a NaN maximum makes `m`, and with it `L`,
//! NaN; an infinite `m` is handled where the written sum is formed, as in the one-pass form.

use super::{BodyExp, RowState, Rows, TASKS_PER_CORE, Window, bodies_over_state, body_exponential, matched};
use crate::opt::Opts;
use crate::rangeify::Ctx;
use crate::util::largest_divisor_at_most;
use uopc_ir::{AxisType, DType, TileOp, UOp, buffer, f32c, sink, tile};

/// Fewest elements a row needs before it is split: below this a row's pass is a few
/// microseconds, which a second kernel and its merge would not win back.
const SPLIT_MIN_COLS: usize = 1 << 15;
/// Fewest elements per chunk, so each task's tile call still streams long runs of memory.
const SPLIT_MIN_CHUNK: usize = 4096;

/// The two kernels of the split form, and the partial states between them.
pub(crate) struct SplitRows {
    /// Reads the input, writes each chunk's state.
    pub(crate) partials: UOp,
    /// Reads the states (and the body's own inputs), writes the body.
    pub(crate) body: UOp,
    /// f32 elements of the buffer of states: a maximum and a sum per chunk.
    pub(crate) states: usize,
}

/// Chunks per row for `rows` rows of `cols` elements on `cores` cores: enough that the tasks
/// number [`TASKS_PER_CORE`] per core, as a divisor of `cols` (every chunk the same length, one
/// tile op for all); `None` when the rows alone give the tasks, the rows are short, or no
/// divisor leaves chunks of [`SPLIT_MIN_CHUNK`].
fn chunks_per_row(rows: usize, cols: usize, cores: usize) -> Option<usize> {
    let want = TASKS_PER_CORE * cores;
    if rows == 0 || rows >= want || cols < SPLIT_MIN_COLS {
        return None;
    }
    let chunks = largest_divisor_at_most(cols, want.div_ceil(rows));
    (chunks > 1 && cols / chunks >= SPLIT_MIN_CHUNK).then_some(chunks)
}

/// The split form of kernel `body` writing `out` (see the module docs), its buffer of states at
/// slot `states_slot`; `None` when `body` is not an online group over rows, or its rows give
/// the cores enough tasks already.
pub(crate) fn lower_online_rows_split(body: &UOp, out: &UOp, states_slot: usize) -> Option<SplitRows> {
    let g = matched(body)?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let chunks = chunks_per_row(g.rows, g.cols, cores)?;
    let tasks = g.rows * chunks;
    let states = buffer(states_slot, DType::F32, 2 * tasks);
    let partials = partial_states(&g, &states, chunks);
    let exp = body_exponential(body, &g);
    let body = merged_body(&g, body, out, exp, &states, chunks)?;
    Some(SplitRows { partials, body, states: 2 * tasks })
}

/// Kernel 1: task `t` reduces chunk `t % chunks` of row `t / chunks` and writes its maximum at
/// `states[t]` and its sum at `states[rows * chunks + t]`.
fn partial_states(g: &Rows, states: &UOp, chunks: usize) -> UOp {
    let (chunk, tasks) = (g.cols / chunks, g.rows * chunks);
    let f32t = DType::F32;
    let mut cx = Ctx::new(Opts::default(), true);
    let (mx, raw) = (cx.fresh_alloc(f32t, 1), cx.fresh_alloc(f32t, 1));
    let t = cx.fresh_range(tasks, AxisType::Thread, &[]);
    let th = std::slice::from_ref(&t);
    let (row, piece) = (t.idiv(chunks as i64), t.modulo(chunks as i64));
    let init_m = mx.after(th).index(0).store(f32c(f32::NEG_INFINITY));
    let init_l = raw.after(th).index(0).store(0.0f32);
    let x = buffer(g.input.slot, g.input.dtype, g.input.len);
    let first = row * g.ld as i64 + piece * chunk as i64 + g.input.base as i64;
    let step = TileOp::MaxSumExp { rows: 1, cols: chunk, ld: g.ld, scale: g.base2.to_bits() };
    let lse = tile(step, &[x.index(&first), mx.after(&[init_m]).index(0), raw.after(&[init_l]).index(0)]);
    let done = std::slice::from_ref(&lse);
    let (m, l) = (mx.after(done).index(0).load(), raw.after(done).index(0).load());
    let writes = sink(&[states.index(&t).store(m), states.index(&t + tasks as i64).store(l)]);
    sink(&[writes.end(th)])
}

/// Kernel 2: per task, one row's states merged (see the module docs), then the body over the
/// row, or over one chunk of its elements for an elementwise body (`rows * chunks` tasks).
fn merged_body(
    g: &Rows,
    body: &UOp,
    out: &UOp,
    exp: Option<BodyExp>,
    states: &UOp,
    chunks: usize,
) -> Option<UOp> {
    let f32t = DType::F32;
    let tasks = g.rows * chunks;
    let elementwise = body.shape() != g.max.shape();
    let per_row = if elementwise { chunks } else { 1 };
    let mut cx = Ctx::new(Opts::default(), true);
    let (mx, raw, sum) = (cx.fresh_alloc(f32t, 1), cx.fresh_alloc(f32t, 1), cx.fresh_alloc(f32t, 1));
    let t = cx.fresh_range(g.rows * per_row, AxisType::Thread, &[]);
    let th = std::slice::from_ref(&t);
    let row = if per_row > 1 { t.idiv(per_row as i64) } else { t.clone() };
    let (mi, ri) = (mx.after(th), raw.after(th));
    let init_m = mi.index(0).store(f32c(f32::NEG_INFINITY));
    let init_l = ri.index(0).store(0.0f32);
    let state_of = |c: &UOp| &row * chunks as i64 + c;
    // m = max_c m_c (NaN-propagating, as MAX is)
    let c1 = cx.fresh_range(chunks, AxisType::Reduce, th);
    let mc = mi.after(&[init_m, c1.clone()]);
    let max_loop =
        mc.index(0).store(mc.index(0).load().maximum(states.index(state_of(&c1)).load())).end(&[c1]);
    let m_all = mi.after(std::slice::from_ref(&max_loop)).index(0).load();
    // L = sum_c L_c exp2(k (m_c - m)), a chunk of -inf weighing 0
    let c2 = cx.fresh_range(chunks, AxisType::Reduce, th);
    let m_c = states.index(state_of(&c2)).load();
    let weight = m_c.ne(f32c(f32::NEG_INFINITY)).where_(((&m_c - &m_all) * g.base2).exp2(), f32c(0.0));
    let lc = ri.after(&[init_l, c2.clone(), max_loop.clone()]);
    let l_c = states.index(state_of(&c2) + tasks as i64).load();
    let sum_loop = lc.index(0).store(lc.index(0).load() + l_c * &weight).end(&[c2]);
    let merged = [max_loop, sum_loop];
    let state = RowState { max: mx.after(&merged), raw: raw.after(&merged), sum };
    let chunk = g.cols / chunks;
    let window = if elementwise {
        let piece = t.modulo(per_row as i64);
        Window {
            row0: row,
            rows: 1,
            cols: Some((piece * chunk as i64, chunk)),
            first: Some(&t * chunk as i64),
        }
    } else {
        Window { row0: row, rows: 1, cols: None, first: None }
    };
    let kernels = [(body.clone(), out.clone())];
    let stores = bodies_over_state(&mut cx, g, &kernels, &[exp], &t, &state, &window)?;
    let [(store, ranges)] = &stores[..] else { return None };
    Some(sink(&[store.end(&[&ranges[..], th].concat())]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_long_rows_split_into_equal_chunks() {
        // one row on 2 cores: 8 tasks wanted, chunks of at least 4096
        assert_eq!(chunks_per_row(1, 1 << 20, 2), Some(8));
        assert_eq!(chunks_per_row(3, 1 << 20, 2), Some(2), "3 rows: 3 chunks wanted, 2 divide");
        assert_eq!(chunks_per_row(1, 40_000, 2), Some(8), "40000 = 8 x 5000");
        assert_eq!(chunks_per_row(1, 1_000_003, 2), None, "a prime length has no equal chunks");
        assert_eq!(chunks_per_row(8, 1 << 20, 2), None, "the rows alone give the tasks");
        assert_eq!(chunks_per_row(1, 16_384, 2), None, "short rows");
        assert_eq!(chunks_per_row(0, 1 << 20, 2), None);
    }
}
