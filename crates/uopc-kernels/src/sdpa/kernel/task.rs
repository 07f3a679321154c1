//! A task's THREAD range and scratch tiles, their initialization, and the final normalized
//! store of its output rows.

use super::{SdpaKernel, Task};
use crate::LOG2E;
use crate::masked::min_idx;
use crate::sdpa::{Blocking, SdpaConfig};
use uopc_ir::{AxisType, DType, TileOp, UOp, f32c, idx, sink, tile};

/// What THREAD task number `t` of a kernel stands for, numbered
/// `t = (((item * kv_heads + kv_head) * subs + sub) * blocks + query block) * splits + split`
/// (`subs` stacks of `heads_per_task` heads per key/value head, `blocks` query blocks).
pub(super) struct TaskIndices {
    pub split: UOp,
    pub item: UOp,
    pub kv_head: UOp,
    /// The first query head of the task.
    pub head0: UOp,
    /// The query block.
    pub qblk: UOp,
}

impl TaskIndices {
    /// The indices of task `t` under `config` and `blocking`.
    pub fn of(t: &UOp, config: &SdpaConfig, blocking: &Blocking) -> TaskIndices {
        let (group, gs) = (config.heads / config.kv_heads, blocking.heads_per_task);
        let (subs, blocks) = ((group / gs) as i64, config.n_q.div_ceil(blocking.queries) as i64);
        let splits = blocking.splits as i64;
        let rows_of = t.idiv(splits);
        let rest = rows_of.idiv(blocks);
        let item_kv = rest.idiv(subs);
        let kv_head = item_kv.modulo(config.kv_heads as i64);
        let head0 = &kv_head * group as i64 + rest.modulo(subs) * gs as i64;
        TaskIndices {
            split: t.modulo(splits),
            item: item_kv.idiv(config.kv_heads as i64),
            kv_head,
            head0,
            qblk: rows_of.modulo(blocks),
        }
    }
}

/// The first query row of query block `qblk` of `n_q` rows in blocks of `bq`: the last block
/// starts early enough to be full.
pub(super) fn first_query(qblk: &UOp, n_q: usize, bq: usize) -> UOp {
    min_idx(&(qblk * bq as i64), &idx((n_q - bq) as i64))
}

impl SdpaKernel {
    /// The THREAD range, its decomposition and the task's scratch.
    pub(super) fn task(&mut self) -> Task {
        let SdpaConfig { kv_heads, n_q, d, .. } = self.c;
        let bq = self.b.queries;
        let f32t = DType::F32;
        let qdt = self.query_tile_dtype();
        let cols = self.score_tile_cols();
        let p_tile = self.bf16_tiles();
        let pb = &mut self.pb;
        let (qt, s, o, mx, l) = (
            (!self.q_in_place).then(|| pb.alloc(qdt, self.rows * d)),
            pb.alloc(f32t, self.rows * cols),
            pb.alloc(f32t, self.rows * d),
            pb.alloc(f32t, self.rows),
            pb.alloc(f32t, self.rows),
        );
        // Only bf16 on bf16 GEMMs keeps P in a tile of its own (see `key_block`).
        let p = self.half.filter(|_| p_tile).map(|el| pb.alloc(el, self.rows * cols));
        // A constant slope, then each stacked head's origin.
        let ramp_scalars = self.ramp.is_some().then(|| pb.alloc(f32t, 1 + self.b.heads_per_task));
        let t = pb.range(self.b.tasks(&self.c), AxisType::Thread);
        let TaskIndices { split, item, kv_head, head0, qblk } = TaskIndices::of(&t, &self.c, &self.b);
        let [ksb, ksh, _] = self.views.k.strides;
        let kv_base = &item * ksb + &kv_head * ksh;
        let panel_base = self.panels.map(|panels| {
            let head = &item * kv_heads + &kv_head;
            (&head * panels.k_head, &head * panels.v_head)
        });
        let q0 = first_query(&qblk, n_q, bq);
        let th = std::slice::from_ref(&t);
        Task {
            qt: qt.map(|qt| qt.after(th)),
            si: s.after(th),
            oi: o.after(th),
            mi: mx.after(th),
            li: l.after(th),
            pi: p.map(|p| p.after(th)),
            ri: ramp_scalars.map(|r| r.after(th)),
            t,
            split,
            item,
            kv_base,
            panel_base,
            head0,
            q0,
            qblk,
        }
    }

    /// The dtype of the task's query tile: f32, except bf16 on bf16 GEMMs (which take bf16 A
    /// and B, natively on AMX). An f16 query, and a bf16 one whose GEMMs widen or read f32
    /// panels, is widened into an f32 tile once per task, so the score GEMM of every key block
    /// reads f32 A (and widens only the keys while packing them, or reads their panels).
    pub(super) fn query_tile_dtype(&self) -> DType {
        if self.bf16_tiles() { DType::BF16 } else { DType::F32 }
    }

    /// bf16 on bf16 GEMMs: bf16 query and P tiles ([`Blocking::bf16_tiles`]).
    fn bf16_tiles(&self) -> bool {
        self.b.bf16_tiles(&self.c)
    }

    /// The scaled copy of the task's queries (when it has a query tile), the zeroed output
    /// tile and the running max and sum, as effects the key loops come after.
    pub(super) fn init(&mut self, task: &Task) -> Vec<UOp> {
        let d = self.c.d;
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        let [qsb, qsh, qsn] = self.views.q.strides;
        let q_off = self.views.q.offset as i64;
        let qscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        let qdt = self.query_tile_dtype();
        let pb = &mut self.pb;
        let mut effects = Vec::new();
        if let Some(qt) = &task.qt {
            let hh = pb.range(gs, AxisType::Loop);
            let load_q = if self.half.is_some_and(|el| el != qdt) {
                // A 16-bit query widened into the f32 tile, one head's rows per conversion (16
                // values per instruction, where the loop below would convert four at a time).
                let widen = TileOp::Convert { rows: bq, cols: d, lds: qsn, ldd: d };
                let head_rows = &task.item * qsb + (&task.head0 + &hh) * qsh + &task.q0 * qsn + q_off;
                tile(widen, &[self.q.index(head_rows), qt.index(&hh * (bq * d))]).end(&[hh])
            } else {
                let rq = pb.range(bq, AxisType::Loop);
                let e = pb.range(d, AxisType::Loop);
                let src = self.q.index(
                    &task.item * qsb + (&task.head0 + &hh) * qsh + (&task.q0 + &rq) * qsn + &e + q_off,
                );
                // A 16-bit query is copied exactly; its scale is applied to the f32 scores instead.
                let value = if self.half.is_some() { src.load() } else { src.load() * qscale };
                qt.index((&hh * bq + &rq) * d + &e).store(value).end(&[e, rq, hh])
            };
            effects.push(load_q);
        }
        let z = pb.range(self.rows * d, AxisType::Loop);
        let init_o = task.oi.index(&z).store(0.0f32).end(&[z]);
        let r = pb.range(self.rows, AxisType::Loop);
        let init_ml =
            sink(&[task.mi.index(&r).store(f32c(f32::NEG_INFINITY)), task.li.index(&r).store(0.0f32)])
                .end(&[r]);
        effects.extend([init_o, init_ml]);
        effects
    }

    /// The division of the task's output rows by their sums (0 for a row that saw no key)
    /// after the key loops `done`, stored into the output; and the program's SINK.
    pub(super) fn write(&mut self, task: &Task, done: &UOp) -> UOp {
        let SdpaConfig { heads, n_q, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        // The output is densely packed (`Views::check`): only the order of heads and rows varies.
        let [qsb, qsh, qsn] = self.views.out.strides;
        let after = std::slice::from_ref(done);
        if let Some((pm, pl)) = &self.partial {
            // Split-K: the task's unnormalized state, at `t * c + r` (disjoint per task).
            let rows = self.rows;
            let r = self.pb.range(rows, AxisType::Loop);
            let at = &task.t * rows + &r;
            let states = sink(&[
                pm.index(&at).store(task.mi.after(after).index(&r).load()),
                pl.index(&at).store(task.li.after(after).index(&r).load()),
            ]);
            let e = self.pb.range(d, AxisType::Loop);
            let o = task.oi.after(after).index(&r * d + &e).load();
            let st = self.out.index(&task.t * (rows * d) + &r * d + &e).store(o).end(&[e]);
            return sink(&[sink(&[states, st]).end(&[r, task.t.clone()])]);
        }
        let contiguous = self.views.out.strides == [heads * n_q * d, n_q * d, d];
        let blocks = n_q.div_ceil(bq);
        let own_rows = contiguous && n_q.is_multiple_of(bq) && (gs == 1 || blocks == 1);
        if let (Some(_), true) = (self.half, own_rows) {
            return self.write_half_rows(task, done);
        }
        // Rows of the (overlapping) last block that the block before it already wrote.
        let skip = (&task.qblk * bq - (n_q - bq) as i64).maximum(idx(0));
        let pb = &mut self.pb;
        let hh = pb.range(gs, AxisType::Loop);
        let rq = pb.range(-&skip + bq as i64, AxisType::Loop);
        let e = pb.range(d, AxisType::Loop);
        let row = min_idx(&(&skip + &rq), &idx(bq as i64 - 1));
        let r = &hh * bq + &row;
        let l = task.li.after(after).index(&r).load();
        // l = 0: no key seen, zeros; l NaN: a NaN key was seen, NaN.
        let inv_l = l.ne(0.0f32).where_(l.recip(), f32c(0.0));
        if self.half.is_some() {
            return self.write_half_row_by_row(task, after, [&hh, &rq], (&row, &r, &e), &inv_l);
        }
        let o = task.oi.after(after).index(&r * d + &e).load();
        let at = if own_rows {
            // Task t then owns the `gs * bq` output rows starting at row `t * gs * bq`: the
            // index is written as `t * c + r` with `0 <= r < c`, the form from which the
            // compiler proves that tasks write disjoint memory and runs them in parallel.
            &task.t * (gs * bq * d) + (&hh * bq + &row) * d + &e
        } else {
            &task.item * qsb + (&task.head0 + &hh) * qsh + (&task.q0 + &row) * qsn + &e
        };
        let st = self.out.index(at).store(o * inv_l);
        let Some(lse) = &self.lse else { return sink(&[st.end(&[e, rq, hh, task.t.clone()])]) };
        // The same row numbering as the output's (so the same disjointness proof holds).
        let lse_at = if own_rows {
            &task.t * (gs * bq) + &hh * bq + &row
        } else {
            (&task.item * heads + &task.head0 + &hh) * n_q + &task.q0 + &row
        };
        let m = task.mi.after(after).index(&r).load();
        let lse_st = lse.index(lse_at).store(m + l.log2());
        sink(&[sink(&[st.end(&[e]), lse_st]).end(&[rq, hh, task.t.clone()])])
    }

    /// [`Self::write`] for a 16-bit output in any other layout or blocking: each row the task
    /// writes (`row` of head `hh`, loops `hh` and `rq` outermost first, tile row `r`, column
    /// loop `e`) divided by its sum in place in f32, then rounded into the output by one
    /// [`TileOp::Convert`] of that row: the values of a store loop's `(o * inv_l) as dtype`,
    /// bit for bit, 16 per instruction where a CAST converts four at a time with integer
    /// operations.
    fn write_half_row_by_row(
        &mut self,
        task: &Task,
        after: &[UOp],
        [hh, rq]: [&UOp; 2],
        (row, r, e): (&UOp, &UOp, &UOp),
        inv_l: &UOp,
    ) -> UOp {
        let SdpaConfig { heads, n_q, d, .. } = self.c;
        let [qsb, qsh, qsn] = self.views.out.strides;
        let cell = task.oi.after(after).index(r * d + e);
        let normalize = cell.store(cell.load() * inv_l).end(std::slice::from_ref(e));
        let narrow = TileOp::Convert { rows: 1, cols: d, lds: d, ldd: d };
        let out_at = &task.item * qsb + (&task.head0 + hh) * qsh + (&task.q0 + row) * qsn;
        let st = tile(narrow, &[task.oi.after(&[normalize]).index(r * d), self.out.index(out_at)]);
        let mut row_done = vec![st];
        if let Some(lse) = &self.lse {
            let lse_at = (&task.item * heads + &task.head0 + hh) * n_q + &task.q0 + row;
            let l = task.li.after(after).index(r).load();
            let m = task.mi.after(after).index(r).load();
            row_done.push(lse.index(lse_at).store(m + l.log2()));
        }
        sink(&[sink(&row_done).end(&[rq.clone(), hh.clone(), task.t.clone()])])
    }

    /// [`Self::write`] for a 16-bit output whose task owns `rows` contiguous output rows
    /// (starting at row `t * rows`): the output tile divided by the sums in place, in f32,
    /// then rounded into the output by one [`TileOp::Convert`] (16 values per instruction,
    /// where a CAST in the store loop converts four at a time with integer operations). The
    /// values are those of the store loop's `(o * inv_l) as dtype`, bit for bit.
    fn write_half_rows(&mut self, task: &Task, done: &UOp) -> UOp {
        let d = self.c.d;
        let rows = self.rows;
        let after = std::slice::from_ref(done);
        let r = self.pb.range(rows, AxisType::Loop);
        let e = self.pb.range(d, AxisType::Loop);
        let l = task.li.after(after).index(&r).load();
        // l = 0: no key seen, zeros; l NaN: a NaN key was seen, NaN.
        let inv_l = l.ne(0.0f32).where_(l.recip(), f32c(0.0));
        let cell = task.oi.after(after).index(&r * d + &e);
        let normalize = cell.store(cell.load() * inv_l).end(&[e]);
        let row_done = match &self.lse {
            // The row numbering of the output's (task t owns rows `t * rows ..`).
            Some(lse) => {
                let m = task.mi.after(after).index(&r).load();
                sink(&[normalize, lse.index(&task.t * rows + &r).store(m + l.log2())])
            }
            None => normalize,
        };
        let normalized = row_done.end(&[r]);
        let narrow = TileOp::Convert { rows, cols: d, lds: d, ldd: d };
        let st = tile(narrow, &[task.oi.after(&[normalized]).index(0), self.out.index(&task.t * (rows * d))]);
        sink(&[st.end(&[task.t.clone()])])
    }
}
