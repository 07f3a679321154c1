//! Attention mods in the backward: the score and mask functions on the recomputed score tile,
//! the score function's derivative on the gradient tile (dS by the chain rule, and the float
//! captures' gradients), and the (query block, key block) pairs the mask's key bounds skip.

use super::BackwardBlocking;
use super::program::{BackwardKernel, KeyBlock, Outputs, Task, flag};
use super::score_fn::{capture_loads, check_differentiable};
use crate::LOG2E;
use crate::masked::min_idx;
use crate::sdpa::flex::{KeyBounds, placeholders};
use crate::sdpa::kernel::extreme_over_rows;
use crate::sdpa::{AttentionMods, SdpaConfig, SdpaError};
use std::f32::consts::LN_2;
use uopc_ir::{AxisType, DType, UOp, derivative, f32c, idx, sink};

/// The FlashAttention-2 backward of attention with `mods` (as [`sdpa_flex_ir`](crate::sdpa::sdpa_flex_ir)
/// runs it forward): the program of [`sdpa_backward_ir`](super::sdpa_backward_ir) whose
/// recomputed scores go through the score and mask functions, whose gradient at the scores
/// is multiplied by the score function's derivative (`dS = P * (dP - Delta) * f'(s)`, the
/// chain rule), and which skips the (query block, key block) pairs the mask's key bounds
/// exclude and runs without the mask those every row sees whole.
///
/// Buffers: 0 to 8 as [`sdpa_backward_ir`](super::sdpa_backward_ir) (the lse is the flex
/// forward's, sinks included), then the key lengths if any, the captures in declaration
/// order, and with `capture_grads` one gradient target per F32 capture: task-major, one region
/// of the capture's length per task, which the task zeroes and sums its terms
/// `dS * df/dc` into (the caller adds the regions). The sinks' gradient is not the kernel's
/// (it is a sum over rows of the lse and Delta).
///
/// # Errors
///
/// [`SdpaError::Capture`] when the score function has no derivative (an op outside the
/// scalar ALU ops), or the configuration has a bool mask or bias.
pub fn sdpa_flex_backward_ir(
    config: &SdpaConfig,
    blocking: &BackwardBlocking,
    mods: &AttentionMods,
    capture_grads: bool,
) -> Result<UOp, SdpaError> {
    crate::sdpa::forward::check_flex(config, mods)?;
    check_differentiable(mods)?;
    let outputs = Outputs { captures: capture_grads, ..Outputs::GRADS };
    Ok(BackwardKernel::new(config, blocking, outputs, Some(mods)).program())
}

impl BackwardKernel {
    /// The query blocks of head `hh` of the group against key block `kb` under a mask
    /// function: each full block runs masked, whole (the score function alone) or not at all,
    /// as the mask's key bounds at its first and last rows say (with the causal limit and the
    /// item's key length); the narrower last block always runs masked.
    pub(super) fn flex_query_blocks(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp) {
        let Some((mods, buffers)) = self.mods.clone() else { return };
        let br = self.b.queries;
        let (full_qb, rest_q) = (self.g.full_qb, self.g.rest_q);
        let head = &task.kv_head * self.g.group as i64 + hh;
        let [_, _, q, kv] = placeholders();
        let (_, mask, _) = mods.build((&task.item, &head, &q, &kv), &buffers, None);
        let mut bounds =
            mask.map_or(KeyBounds { exact: true, ..KeyBounds::default() }, |m| KeyBounds::of(&m, &kv));
        bounds.end.extend(self.key_ends(task, &q));
        // The per-run counts cover the full key blocks.
        let counted = self.plan.clone().filter(|_| kb.cols == self.b.keys);
        if full_qb > 0 {
            self.looped(idx(full_qb as i64), AxisType::Reduce, |me, qb| {
                let q0 = qb * br as i64;
                let (partial, whole) = match &counted {
                    Some((plan, per_head)) => me.counted_guards(plan, *per_head, (&task.item, &head, qb), kb),
                    None => me.pair_guards(&bounds, &q, (&q0, br), kb),
                };
                me.looped(partial, AxisType::Reduce, |me, _| me.pair(task, kb, hh, &q0, br, true));
                me.looped(whole, AxisType::Reduce, |me, _| me.pair(task, kb, hh, &q0, br, false));
            });
        }
        if rest_q > 0 {
            let q0 = idx((full_qb * br) as i64);
            self.pair(task, kb, hh, &q0, rest_q, true);
        }
    }

    /// The trip counts (0 or 1) of the masked and of the whole run of the pair of query rows
    /// `q0 .. q0 + rows` and key block `kb`, from `bounds` over the placeholder row `q`: the
    /// pair runs when some row may see some key of the block (the least start is below its
    /// end, the greatest end past its start), whole when the bounds are the whole mask and
    /// every row sees every key.
    fn pair_guards(
        &self,
        bounds: &KeyBounds,
        q: &UOp,
        (q0, rows): (&UOp, usize),
        kb: &KeyBlock,
    ) -> (UOp, UOp) {
        let (first, last) = (q0.clone(), q0 + (rows as i64 - 1));
        let over = |e: &UOp, least: bool| extreme_over_rows(e, q, (&first, &last), least);
        let [lowest, seen_from, seen_to, highest] = bounds.extremes(over, self.c.n_k as i64);
        let (k0, k1) = (kb.k0.clone(), &kb.k0 + kb.cols as i64);
        let run = flag(&min_idx(&(highest - &k0), &(&k1 - lowest)));
        // Without a span seen whole (`n_k` to 0) no block is: `k0 - n_k + 1 <= 0`.
        let whole = flag(&min_idx(&(&k0 - seen_from + 1), &(seen_to - &k1 + 1)));
        (min_idx(&run, &(-&whole + 1)), min_idx(&run, &whole))
    }

    /// [`Self::pair_guards`] from the per-run counts: the pair of full query block `qb` of
    /// `(item, head)` and full key block `kb` runs when its count is not zero, whole when it
    /// is every pair of the block.
    fn counted_guards(
        &self,
        plan: &UOp,
        per_head: bool,
        (item, head, qb): (&UOp, &UOp, &UOp),
        kb: &KeyBlock,
    ) -> (UOp, UOp) {
        let (br, bc) = (self.b.queries as i64, self.b.keys as i64);
        let blocks = self.c.n_q.div_ceil(self.b.queries) as i64;
        let unit =
            if per_head { (item * self.c.heads as i64 + head) * blocks + qb } else { item * blocks + qb };
        let count = plan.index(unit * self.g.full_kb as i64 + kb.k0.idiv(bc)).load().cast(DType::INDEX);
        let (run, whole) = (flag(&count), flag(&(&count - (br * bc - 1))));
        (min_idx(&run, &(-&whole + 1)), whole)
    }

    /// The loop over the score tile of a pair under mods: the base-2 scores back to natural
    /// units, the score function (its input kept in the task's `raw` tile for the
    /// derivative), and with `masked` the keys a row does not see set to `-inf` (the mask
    /// function, the causal limit, the item's key length).
    pub(super) fn flex_tile(
        &mut self,
        task: &Task,
        kb: &KeyBlock,
        head: &UOp,
        q0: &UOp,
        rows: usize,
        masked: bool,
    ) {
        let Some((mods, buffers)) = self.mods.clone() else { return };
        if !masked && !mods.has_score() {
            return;
        }
        if masked && !mods.has_score() && mods.mask_analysis().is_some_and(|a| a.bounds.exact) {
            let [_, _, _, kv] = placeholders();
            let row = self.pb.range(rows, AxisType::Loop);
            let query = q0 + &row;
            let (_, mask, _) = mods.build((&task.item, head, &query, &kv), &buffers, None);
            let bounds = mask.map(|m| KeyBounds::of(&m, &kv)).filter(|b| b.exact);
            if let Some(mut bounds) = bounds {
                bounds.end.extend(self.key_ends(task, &query));
                self.mask_outside_bounds(task, kb, row, bounds);
                return;
            }
        }
        let cols = kb.cols;
        let rq = self.pb.range(rows, AxisType::Loop);
        let cc = self.pb.range(cols, AxisType::Loop);
        let at = &rq * cols as i64 + &cc;
        let cell = self.at(&task.s, at.clone());
        let (key, query) = (&kb.k0 + &cc, q0 + &rq);
        let natural = cell.load() * LN_2;
        let (modified, mask, _) = mods.build((&task.item, head, &query, &key), &buffers, Some(&natural));
        let mut effects = Vec::new();
        let mut score = cell.load();
        if let Some(s) = modified {
            let s = s.cast(DType::F32);
            if let Some(slope) = &task.slope {
                let d = derivative(&s, &natural).expect("checked by sdpa_flex_backward_ir");
                effects.push(self.at(slope, at.clone()).store(d.unwrap_or_else(|| f32c(0.0))));
            }
            if let Some(raw) = &task.raw {
                effects.push(self.at(raw, at).store(natural));
            }
            score = s * (LOG2E as f32);
        }
        if masked {
            let ends = self.key_ends(task, &query);
            let keep = mask.into_iter().chain(ends.iter().map(|end| key.lt(end)));
            for c in keep {
                score = c.where_(&score, f32c(f32::NEG_INFINITY));
            }
        }
        effects.push(cell.store(score));
        self.chain = vec![sink(&effects).end(&[cc, rq])];
    }

    /// [`Self::flex_tile`] for a mask that is only bounds on the key (`bounds`, at the tile's
    /// row `row`, the row limits included) without a score function: per row, the
    /// columns before its greatest start and from its least end are set to `-inf` without
    /// reading the scores (the suffix after the prefix, which it overlaps on a row that sees
    /// none of the block).
    fn mask_outside_bounds(&mut self, task: &Task, kb: &KeyBlock, row: UOp, bounds: KeyBounds) {
        let cols = kb.cols as i64;
        let (seen_from, seen_to) = bounds.block_columns(&kb.k0, kb.cols);
        let row_at = &row * cols;
        let mut done = Vec::new();
        if let Some(from) = seen_from {
            let rc = self.pb.range(from, AxisType::Loop);
            let cell = self.at(&task.s, &row_at + &rc);
            done = vec![cell.store(f32c(f32::NEG_INFINITY)).end(&[rc])];
        }
        if let Some(to) = seen_to {
            // Counted down from the last column, so every index is inside the row whatever the
            // suffix's length.
            let rc = self.pb.range(-&to + cols, AxisType::Loop);
            let mut deps = self.chain.clone();
            deps.append(&mut done);
            let cell = task.s.after(&deps).index(&row_at + (-&rc + (cols - 1)));
            done = vec![cell.store(f32c(f32::NEG_INFINITY)).end(&[rc])];
        }
        if !done.is_empty() {
            self.chain = vec![sink(&done).end(&[row])];
        }
    }

    /// The loop over the gradient tile of a pair that applies the chain rule through the score
    /// function `f`: `dS *= f'(s)` at each score (from the `slope` tile, or a constant), and,
    /// with capture gradients, `dc += dS / scale * df/dc` for each load `c` of a float capture
    /// in `f` (its derivative at the score in the `raw` tile), into the task's region at the
    /// element the load read: summed over the row first when that element does not change
    /// along it (a per-head slope), else added term by term. Terms where `dS` is zero (keys
    /// the row does not see) are zero, whatever the derivative is there.
    pub(super) fn score_grad_tile(&mut self, task: &Task, kb: &KeyBlock, head: &UOp, q0: &UOp, rows: usize) {
        let Some((mods, buffers)) = self.mods.clone() else { return };
        let constant = self.score_tiles.constant;
        if task.slope.is_none() && constant == Some(1.0) && task.raw.is_none() {
            return;
        }
        let cols = kb.cols;
        let rq = self.pb.range(rows, AxisType::Loop);
        let cc = self.pb.range(cols, AxisType::Loop);
        let at = &rq * cols as i64 + &cc;
        let ds_cell = self.at(&task.dp, at.clone());
        let ds = ds_cell.load();
        let seen = ds.ne(0.0f32);
        let mut effects = Vec::new();
        match (&task.slope, constant) {
            (Some(slope), _) => {
                effects.push(ds_cell.store(seen.where_(&ds * self.at(slope, at.clone()).load(), 0.0f32)));
            }
            (None, Some(c)) if c != 1.0 => effects.push(ds_cell.store(&ds * c as f32)),
            _ => {}
        }
        let mut row_sums = Vec::new();
        if let Some(raw) = &task.raw {
            let x = self.at(raw, at).load();
            let (key, query) = (&kb.k0 + &cc, q0 + &rq);
            let (f, _, _) = mods.build((&task.item, head, &query, &key), &buffers, Some(&x));
            let f = f.expect("a raw tile only with a score function").cast(DType::F32);
            // Inside both loops, after the previous sums: loads of one element repeat across
            // iterations, so no load of a target may be hoisted past a store to it.
            let mut deps = self.chain.clone();
            deps.extend([rq.clone(), cc.clone()]);
            let unscale = (1.0 / f64::from(self.c.effective_scale())) as f32;
            for (load, position, flat) in capture_loads(&f, &buffers) {
                let Some(Some((target, len))) = self.dcaptures.get(position) else { continue };
                let Some(d) = derivative(&f, &load).expect("checked by sdpa_flex_backward_ir") else {
                    continue;
                };
                let term = seen.where_(&ds * unscale * d, 0.0f32);
                let at = &task.t * *len as i64 + &flat;
                if UOp::toposort(std::slice::from_ref(&flat)).contains(&cc) {
                    let cell = target.after(&deps).index(at);
                    let store = cell.store(cell.load() + term);
                    deps.push(store.clone());
                    effects.push(store);
                } else {
                    // The element is the row's: summed in a register along the row.
                    let acc = self.pb.alloc(DType::F32, 1);
                    let init = acc.after(&[task.t.clone(), rq.clone()]).index(0).store(0.0f32);
                    let a = acc.after(&[init.clone(), cc.clone()]).index(0);
                    effects.push(a.store(a.load() + term));
                    row_sums.push((acc, target.clone(), at));
                }
            }
        }
        let along_row = sink(&effects).end(&[cc.clone()]);
        let mut row_effects = vec![along_row.clone()];
        let mut deps = self.chain.clone();
        deps.extend([rq.clone(), along_row.clone()]);
        for (acc, target, at) in row_sums {
            let total = acc.after(std::slice::from_ref(&along_row)).index(0).load();
            let cell = target.after(&deps).index(at);
            let store = cell.store(cell.load() + total);
            deps.push(store.clone());
            row_effects.push(store);
        }
        self.chain = vec![sink(&row_effects).end(&[rq])];
    }
}
