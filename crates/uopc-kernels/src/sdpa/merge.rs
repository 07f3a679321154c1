//! The second kernel of split-K attention: the union of the partial softmax states that the
//! key chunks of one row wrote.

use super::{Blocking, SdpaConfig};
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, sink};

/// The merge of a split-K attention's partial states into the output.
///
/// For one output row with chunk states `(m_c, l_c, o_c)` (base-2 running max, running sum,
/// unnormalized output row) and `m = max_c m_c`, the union is `l = sum_c l_c 2^(m_c - m)` and
/// `o = sum_c o_c 2^(m_c - m)`, and the row is `o / l`. A chunk that saw no key (`m_c = -inf`)
/// weighs 0, a row no chunk saw a key of gives zeros (`l = 0`), and a NaN state makes the row
/// NaN. Buffers: 0 = maxima, 1 = sums, 2 = output rows (as [`super::sdpa_ir`] writes them for
/// `blocking`, which must have `splits > 1` and one query block), 3 = the output, laid out as
/// `config.layout` and of `config.dtype`. One THREAD iteration per output row (of a head and query).
pub fn sdpa_merge_ir(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    let &SdpaConfig { batch, heads, kv_heads, n_q, d, .. } = config;
    let &Blocking { heads_per_task: gs, queries, splits, .. } = blocking;
    let rows = gs * queries;
    let groups = batch * kv_heads * (heads / kv_heads / gs);
    let f32t = DType::F32;
    let states = groups * splits * rows;
    let (pm, pl, po) = (buffer(0, f32t, states), buffer(1, f32t, states), buffer(2, f32t, states * d));
    let el = config.dtype.dtype();
    let out = buffer(3, el, config.q_len());
    let mut pb = ProgramBuilder::new();
    let (m, l, o) = (pb.alloc(f32t, 1), pb.alloc(f32t, 1), pb.alloc(f32t, d));

    // t = group * rows + row: the group's chunks wrote row `row` at `(group * splits + c) * rows + row`.
    let t = pb.range(groups * rows, AxisType::Thread);
    let (group, row) = (t.idiv(rows as i64), t.modulo(rows as i64));
    let state = |c: &UOp| (&group * splits + c) * rows + &row;
    let th = std::slice::from_ref(&t);
    let (mi, li, oi) = (m.after(th), l.after(th), o.after(th));
    let init_m = mi.index(0).store(f32c(f32::NEG_INFINITY));
    let init_l = li.index(0).store(0.0f32);
    let e0 = pb.range(d, AxisType::Loop);
    let init_o = oi.index(&e0).store(0.0f32).end(&[e0]);

    let c1 = pb.range(splits, AxisType::Reduce);
    let mc = mi.after(&[init_m, c1.clone()]);
    let max_loop = mc.index(0).store(mc.index(0).load().maximum(pm.index(state(&c1)).load())).end(&[c1]);
    let m_all = mi.after(&[max_loop]).index(0).load();

    let c = pb.range(splits, AxisType::Reduce);
    let m_c = pm.index(state(&c)).load();
    // -inf - -inf would be NaN: a chunk that saw nothing weighs 0 outright.
    let w = m_c.ne(f32c(f32::NEG_INFINITY)).where_((&m_c - &m_all).exp2(), f32c(0.0));
    let lc = li.after(&[init_l, c.clone()]);
    let st_l = lc.index(0).store(lc.index(0).load() + pl.index(state(&c)).load() * &w);
    let e = pb.range(d, AxisType::Loop);
    let oc = oi.after(&[init_o, c.clone()]);
    let st_o = oc.index(&e).store(oc.index(&e).load() + po.index(state(&c) * d + &e).load() * &w).end(&[e]);
    let chunks = sink(&[st_l, st_o]).end(&[c]);

    let done = std::slice::from_ref(&chunks);
    let l_all = li.after(done).index(0).load();
    // l = 0: no key seen, zeros; l NaN: a NaN key was seen, NaN.
    let inv_l = l_all.ne(0.0f32).where_(l_all.recip(), f32c(0.0));
    let e2 = pb.range(d, AxisType::Loop);
    let [qsb, qsh, qsn] = config.layout.strides(heads, n_q, d);
    let at = if config.layout.strides(heads, n_q, d) == [heads * n_q * d, n_q * d, d] {
        // Group g's rows are the output rows g * rows .. (g + 1) * rows: row t, in the
        // `t * c + r` form that proves the iterations disjoint.
        &t * d + &e2
    } else {
        let subs = heads / kv_heads / gs;
        let item = group.idiv((kv_heads * subs) as i64);
        let head = group.modulo((kv_heads * subs) as i64) * gs + row.idiv(queries as i64);
        let query = row.modulo(queries as i64);
        item * qsb + head * qsh + query * qsn + &e2
    };
    let row = oi.after(done).index(&e2).load() * inv_l;
    // Rounded once, into the dtype of the output.
    let st = out.index(at).store(if el == f32t { row } else { row.cast(el) });
    sink(&[st.end(&[e2, t])])
}
