//! One (query block, key block) pair of the backward: the score, softmax and gradient tiles, the
//! mask loop and the bias-gradient loop.

use super::program::{BackwardKernel, KeyBlock, Task};
use crate::LOG2E;
use crate::sdpa::{MaskKind, SdpaConfig};
use uopc_ir::{AxisType, DType, GemmShape, TileOp, UOp, f32c, idx};

impl BackwardKernel {
    /// One (query block, key block) pair: S, the mask, P, dP, dS, and the three accumulations.
    pub(super) fn pair(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp, q0: &UOp, rows: usize, masked: bool) {
        let SdpaConfig { heads, n_q, d, kv_heads, n_k, .. } = self.c;
        let [qsb, qsh, qsn] = self.c.layout.strides(heads, n_q, d);
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let cols = kb.cols;
        let head = &task.kv_head * self.g.group + hh;
        let q_at = &task.item * qsb + &head * qsh + q0 * qsn;
        let row_at = (&task.item * heads + &head) * n_q + q0;
        let gemm = |m, n, k, lda, ldb, ldc, a_trans, accumulate| {
            TileOp::Gemm(GemmShape {
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                a_trans,
                b_trans: false,
                accumulate,
                b_panel_width: 0,
                b_pair_panels: false,
                parallel: false,
            })
        };
        // The score and dP GEMMs' B: the task's K^T or V^T tile, in panels when the copy wrote
        // them so (see `key_block`).
        let panels = self.panel_width(cols);
        let tile_b = |op: TileOp| match (op, panels) {
            (TileOp::Gemm(g), Some(w)) => TileOp::Gemm(GemmShape { ldb: d * w, b_panel_width: w, ..g }),
            (op, _) => op,
        };
        let (s, dp, q, d_o) = (task.s.clone(), task.dp.clone(), self.q.clone(), self.d_o.clone());
        // S = Q (K scale log2 e)^T, base-2 scores.
        self.step(
            tile_b(gemm(rows, cols, d, qsn, cols, cols, false, false)),
            &[(&q, q_at.clone()), (&task.kt, idx(0)), (&s, idx(0))],
        );
        if self.mods.is_some() {
            self.flex_tile(task, kb, &head, q0, rows, masked);
        } else if masked {
            self.mask_tile(task, kb, &head, q0, rows);
        }
        let lse = self.lse.clone();
        self.step(TileOp::SoftmaxRecompute { rows, cols, ld: cols }, &[(&s, idx(0)), (&lse, row_at.clone())]);
        // dP = dO (V scale)^T.
        self.step(
            tile_b(gemm(rows, cols, d, qsn, cols, cols, false, false)),
            &[(&d_o, q_at.clone()), (&task.vt, idx(0)), (&dp, idx(0))],
        );
        let delta = self.delta.clone();
        self.step(
            TileOp::SoftmaxGrad { rows, cols, ld: cols },
            &[(&s, idx(0)), (&dp, idx(0)), (&delta, row_at)],
        );
        if self.mods.as_ref().is_some_and(|(m, _)| m.has_score()) {
            self.score_grad_tile(task, kb, &head, q0, rows);
        }
        if self.dbias.is_some() {
            self.bias_grad_tile(task, kb, hh, q0, rows);
        }
        if !self.outputs.grads {
            return;
        }
        // dV += P^T dO, dK += dS^T Q (dS carries the scale).
        self.step(
            gemm(cols, d, rows, cols, qsn, d, true, true),
            &[(&s, idx(0)), (&d_o, q_at.clone()), (&task.dv_acc, idx(0))],
        );
        self.step(
            gemm(cols, d, rows, cols, qsn, d, true, true),
            &[(&dp, idx(0)), (&q, q_at), (&task.dk_acc, idx(0))],
        );
        // dQ += dS K, into the task's own rows of the dq target.
        let dq_at = &task.t * (self.g.group * n_q * d) + (hh * n_q + q0) * d;
        let (k, dq) = (self.k.clone(), self.dq.clone());
        let k_at = &task.kv_base + &kb.k0 * ksn;
        self.step(gemm(rows, d, cols, cols, ksn, d, false, true), &[(&dp, idx(0)), (&k, k_at), (&dq, dq_at)]);
    }

    /// The loop over the gradient tile that adds `dS = (scale dS) / scale` into the task's
    /// dbias region: the element of head `hh`, row `q0 + r`, key slot `slot_row + c`, with 0
    /// in place of each broadcast coordinate (terms that meet there are summed in order).
    pub(super) fn bias_grad_tile(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp, q0: &UOp, rows: usize) {
        let (Some(dbias), Some([_, region_rows, region_keys])) = (self.dbias.clone(), self.g.bias_region)
        else {
            return;
        };
        let MaskKind::Bias(shape) = self.c.mask else { return };
        let cols = kb.cols;
        let rq = self.pb.range(rows, AxisType::Loop);
        let cc = self.pb.range(cols, AxisType::Loop);
        let head = if shape[1] != 1 { hh.clone() } else { idx(0) };
        let row = if shape[2] != 1 { q0 + &rq } else { idx(0) };
        let key = if shape[3] != 1 { &kb.slot_row + &cc } else { idx(0) };
        let at =
            &task.t * self.g.bias_task_len() + (head * region_rows as i64 + row) * region_keys as i64 + key;
        let unscale = (1.0 / f64::from(self.c.effective_scale())) as f32;
        let d_score = self.at(&task.dp, &rq * cols + &cc).load() * unscale;
        // Inside both loops, after the previous sums: a broadcast coordinate repeats the
        // element across iterations, so the load must not be hoisted past the stores.
        let mut deps = self.chain.clone();
        deps.extend([rq.clone(), cc.clone()]);
        let cell = dbias.after(&deps).index(at);
        self.chain = vec![cell.store(cell.load() + d_score).end(&[cc, rq])];
    }

    /// The ends below which row `query` of `task`'s item sees keys: its causal limit and the
    /// item's key length, where the configuration has them.
    pub(super) fn key_ends(&self, task: &Task, query: &UOp) -> Vec<UOp> {
        let causal = self.c.causal.then(|| query + (self.c.causal_offset() + 1));
        let length = self.lens.as_ref().map(|lens| lens.index(&task.item).load().cast(DType::INDEX));
        causal.into_iter().chain(length).collect()
    }

    /// The loop over the score tile that adds the bias and sets the keys a row does not see
    /// to `-inf` (causal, past the item's key length, false in the bool mask).
    pub(super) fn mask_tile(&mut self, task: &Task, kb: &KeyBlock, head: &UOp, q0: &UOp, rows: usize) {
        let cols = kb.cols;
        let rq = self.pb.range(rows, AxisType::Loop);
        let cc = self.pb.range(cols, AxisType::Loop);
        let cell = self.at(&task.s, &rq * cols + &cc);
        let key = &kb.k0 + &cc;
        let query = q0 + &rq;
        let mut score = cell.load();
        let mut keep: Vec<UOp> = self.key_ends(task, &query).iter().map(|end| key.lt(end)).collect();
        if let Some((buf, shape)) = &self.mask {
            let [sb, sh, sq, sk] = SdpaConfig::mask_strides(*shape);
            let x = buf.index(&task.item * sb + head * sh + &query * sq + &key * sk).load();
            match self.c.mask {
                MaskKind::Bool(_) => keep.push(x),
                _ => score = score + x * (LOG2E as f32),
            }
        }
        for c in keep {
            score = c.where_(&score, f32c(f32::NEG_INFINITY));
        }
        self.chain = vec![cell.store(score).end(&[cc, rq])];
    }
}
