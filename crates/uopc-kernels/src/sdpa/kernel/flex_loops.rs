//! The key loops of a task under attention mods, from the bounds their mask gives, and the
//! sinks' step before the output is written.

use super::flex_plan::in_order;
use super::{BlockMask, SdpaKernel, Task};
use crate::LOG2E;
use crate::masked::min_idx;
use crate::sdpa::flex::{KeyBounds, placeholders};
use crate::sdpa::{AttentionMods, Blocking, SdpaConfig};
use uopc_ir::{AxisType, BinaryOp, DType, IndexFormula, UOp, UnaryOp, f32c, idx, linear_in, sink};

impl SdpaKernel {
    /// The key blocks of a task (one chunk of keys) in three runs, [`Self::flex_blocks`]'s:
    /// masked, then whole (the score function alone, or nothing), then masked; then the narrow
    /// block of `rest` keys, masked. The blocks outside the runs are skipped.
    pub(super) fn flex_key_loops(&mut self, task: &Task, init: &[UOp], full: usize, rest: usize) -> UOp {
        let bc = self.b.keys;
        let [t0, c0, c1, t1] = self.flex_blocks(task, full);
        let scored = self.mods.as_ref().is_some_and(|(m, _)| m.has_score());
        let whole = if scored { BlockMask::ScoreOnly } else { BlockMask::Clear };
        let last_block = idx(((full.max(1) - 1) * bc) as i64);
        let all = self.all_rows();
        let mut prev = init.to_vec();
        for (lo, hi, mask) in
            [(&t0, &c0, BlockMask::Partial), (&c0, &c1, whole), (&c1, &t1, BlockMask::Partial)]
        {
            let kb = self.pb.range(hi - lo, AxisType::Reduce);
            // The min only tells the verifier's interval bounds that the block stays inside
            // the keys (they do not see that kb < hi - lo).
            let start = min_idx(&((lo + &kb) * bc), &last_block);
            let mut after = prev.clone();
            after.push(kb.clone());
            prev = vec![self.key_block(task, &start, bc, &after, mask, all).end(&[kb])];
        }
        let done = prev.pop().unwrap_or_else(|| sink(init));
        if rest == 0 {
            done
        } else {
            self.key_block(task, &idx((full * bc) as i64), rest, &[done], BlockMask::Partial, all)
        }
    }

    /// Full key blocks `[t0, c0)` masked, `[c0, c1)` seen whole by every row of the task, and
    /// `[c1, t1)` masked, with `t0 <= c0 <= c1 <= t1 <= full`; no row sees a key of a full
    /// block outside `[t0, t1)`. Read off the mask's [`KeyBounds`] (with the causal limit, the
    /// KV length and the item's key length) at the task's first and last query rows: bounds
    /// linear in the query row, free of every index but the task's own. Blocks are seen whole
    /// only when those bounds are the whole mask.
    fn flex_blocks(&self, task: &Task, full: usize) -> [UOp; 4] {
        if let Some((plan, per_head)) = &self.flex_plan {
            return self.planned_blocks(plan, *per_head, task, full);
        }
        let Some((mods, buffers)) = &self.mods else { unreachable!("flex loops run with mods") };
        let bc = self.b.keys as i64;
        let [b, h, q, kv] = placeholders();
        // With stacked heads the head varies within the task: bounds that read it are dropped.
        let head = if self.b.heads_per_task == 1 { task.head0.clone() } else { h.clone() };
        let (_, mask, _) = mods.build((&task.item, &head, &q, &kv), buffers, None);
        let mut kb =
            mask.map_or(KeyBounds { exact: true, ..KeyBounds::default() }, |m| KeyBounds::of(&m, &kv));
        if self.c.causal {
            kb.end.push(&q + &self.causal_offset() + 1);
        }
        if let Some(len) = &self.kv_length {
            kb.end.push(len.clone());
        }
        if let Some(lens) = &self.lens {
            kb.end.push(lens.index(&task.item).load().cast(DType::INDEX));
        }
        let (first, last) = (task.q0.clone(), &task.q0 + (self.b.queries as i64 - 1));
        // A bound's least (`least`) or greatest value over the task's rows.
        let over_rows = |e: &UOp, least: bool| {
            let free = !UOp::toposort(std::slice::from_ref(e)).iter().any(|u| u == &b || u == &h);
            free.then(|| extreme_over_rows(e, &q, (&first, &last), least)).flatten()
        };
        let n_k = self.c.n_k as i64;
        let clamp = |x: UOp| min_idx(&x.maximum(idx(0)), &idx(n_k));
        let [lowest, seen_from, seen_to, highest] = kb.extremes(over_rows, n_k);
        // Blocks rounded outwards for the span seen, inwards for the span seen whole.
        let rounded_up = |x: UOp| (clamp(x) + (bc - 1)).idiv(bc);
        in_order(
            [clamp(lowest).idiv(bc), rounded_up(seen_from), clamp(seen_to).idiv(bc), rounded_up(highest)],
            full,
        )
    }

    /// With sinks: each row's sink logit `z` (of its head, base 2: `z log2 e`) joins the
    /// running max and sum after the key loops `done`, rescaling the output row as a key block
    /// would (`m' = max(m, z)`, `l' = l 2^(m - m') + 2^(z - m')`, `o' = o 2^(m - m')`), so the
    /// write divides by a denominator that counts it. Without sinks, `done` as it is.
    pub(super) fn sink_step(&mut self, task: &Task, done: UOp) -> UOp {
        let Some((mods, buffers)) = &self.mods else { return done };
        let Some(logits) = mods.sink_logits() else { return done };
        let sinks = buffers[logits.position()].clone();
        let (gs, bq, d) = (self.b.heads_per_task, self.b.queries, self.c.d);
        let after = std::slice::from_ref(&done);
        let hh = self.pb.range(gs, AxisType::Loop);
        let rq = self.pb.range(bq, AxisType::Loop);
        let e = self.pb.range(d, AxisType::Loop);
        let r = &hh * bq as i64 + &rq;
        let z = sinks.index(&task.head0 + &hh).load() * (LOG2E as f32);
        let m = task.mi.after(after).index(&r);
        let l = task.li.after(after).index(&r);
        let m_old = m.load();
        let m_new = m_old.maximum(&z);
        // A row that saw no key (m = -inf) keeps its zero output: its factor is 0, or 1 when
        // the sink is -inf too.
        let alpha = m_old.ne(&m_new).where_((&m_old - &m_new).exp2(), f32c(1.0));
        let cell = task.oi.after(after).index(&r * d as i64 + &e);
        let rescale = cell.store(cell.load() * &alpha).end(&[e]);
        let own = m_new.ne(f32c(f32::NEG_INFINITY)).where_((&z - &m_new).exp2(), f32c(0.0));
        let sum = l.store(l.load() * &alpha + own);
        sink(&[sink(&[rescale, sum, m.store(m_new)]).end(&[rq, hh])])
    }
}

/// The least (`least`) or greatest value of bound `e` over the query rows `first..=last` of
/// the placeholder `q`: where `e` is linear in `q`, at one end; maxima and negations of such
/// bounds (a union's later end, a min) by their parts; `None` otherwise.
pub(crate) fn extreme_over_rows(e: &UOp, q: &UOp, (first, last): (&UOp, &UOp), least: bool) -> Option<UOp> {
    if let Some((a, r)) = linear_in(e, q) {
        let row = if (a >= 0) == least { first } else { last };
        return Some(r + row * a);
    }
    if let Some((UnaryOp::Neg, x)) = e.as_unary() {
        return Some(-extreme_over_rows(x, q, (first, last), !least)?);
    }
    let (BinaryOp::Max, x, y) = e.as_binary()? else { return None };
    let (x, y) =
        (extreme_over_rows(x, q, (first, last), least)?, extreme_over_rows(y, q, (first, last), least)?);
    Some(x.maximum(&y))
}

/// The key blocks each THREAD task of [`sdpa_flex_ir`](super::sdpa_flex_ir) runs, as
/// `[t0, c0, c1, t1]` per task in task order: full blocks `[t0, c0)` and `[c1, t1)` masked,
/// `[c0, c1)` whole, the others skipped (the narrow last block, if any, always runs masked).
/// `None` when the bounds read run-time values (key lengths, a runtime KV length, a capture).
pub fn flex_block_plan(
    config: &SdpaConfig,
    blocking: &Blocking,
    mods: &AttentionMods,
) -> Option<Vec<[usize; 4]>> {
    let mut kernel = SdpaKernel::new(config, blocking, false, false, Some(mods), None);
    let task = kernel.task();
    let bounds = kernel.flex_blocks(&task, config.n_k / blocking.keys);
    let formulas: Option<Vec<IndexFormula>> =
        bounds.iter().map(|e| IndexFormula::over_ranges(e, std::slice::from_ref(&task.t))).collect();
    let formulas = formulas?;
    (0..blocking.tasks(config))
        .map(|t| {
            let mut plan = [0; 4];
            for (p, f) in plan.iter_mut().zip(&formulas) {
                *p = usize::try_from(f.eval(&[t as i64])?).ok()?;
            }
            Some(plan)
        })
        .collect()
}
