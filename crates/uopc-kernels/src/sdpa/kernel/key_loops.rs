//! The key loops of a task: which key blocks every row sees whole, which in part, and the
//! causal band's sub-tiles.

use super::{BlockMask, SdpaKernel, Span, Task};
use crate::masked::min_idx;
use crate::sdpa::blocking::CAUSAL_SUB_ROWS;
use uopc_ir::{AxisType, DType, UOp, idx, sink};

impl SdpaKernel {
    /// All rows of the task.
    pub(super) fn all_rows(&self) -> Span {
        Span { r0: 0, rows: self.rows }
    }

    /// The key loops of a causal task taller than one sub-tile (one query block of one head):
    /// the full blocks every row sees on all rows, unmasked; then per sub-tile of
    /// [`CAUSAL_SUB_ROWS`] rows the further blocks its rows see whole (unmasked) and those
    /// they see in part (masked); last the narrow block of `rest` keys, if any, on all rows.
    pub(super) fn causal_sub_tiles(&mut self, task: &Task, init: &[UOp], full: usize, rest: usize) -> UOp {
        let bc = self.b.keys;
        let masked_everywhere = self.mask.is_some();
        let last_block = idx(((full.max(1) - 1) * bc) as i64);
        let all = self.all_rows();
        let (clear_all, _) = self.block_bounds(task, full, all);
        let mut prev = init.to_vec();
        if !masked_everywhere {
            let wide = self.b.causal_prefix_keys(&self.c);
            if wide == bc {
                let kb = self.pb.range(clear_all.clone(), AxisType::Reduce);
                let mut after = prev.clone();
                after.push(kb.clone());
                prev = vec![self.key_block(task, &(&kb * bc), bc, &after, BlockMask::Clear, all).end(&[kb])];
            } else {
                // Pairs of blocks as one wide block, then the odd block left over, if any. The
                // mins only tell the verifier's interval bounds that each block stays inside
                // the keys.
                let per = (wide / bc) as i64;
                let kw = self.pb.range(clear_all.idiv(per), AxisType::Reduce);
                let last_wide = idx(((full / (wide / bc)).max(1) - 1) as i64 * wide as i64);
                let start = min_idx(&(&kw * wide), &last_wide);
                let mut after = prev.clone();
                after.push(kw.clone());
                let pairs = self.key_block(task, &start, wide, &after, BlockMask::Clear, all).end(&[kw]);
                let ko = self.pb.range(clear_all.modulo(per), AxisType::Reduce);
                let start = min_idx(&((&clear_all - 1).maximum(idx(0)) * bc), &last_block);
                prev = vec![
                    self.key_block(task, &start, bc, &[pairs, ko.clone()], BlockMask::Clear, all).end(&[ko]),
                ];
            }
        }
        for r0 in (0..self.rows).step_by(CAUSAL_SUB_ROWS) {
            let span = Span { r0, rows: CAUSAL_SUB_ROWS.min(self.rows - r0) };
            // With the keys at or ahead of the queries, a sub-tile whose masked keys are its
            // diagonal block alone sees exactly the blocks `[clear_all, clear_all + r0 / bc]`:
            // one block of those keys when the score tile is that wide, so it pays for one
            // softmax step (one rescale of its output rows) instead of one per block.
            let merged = (r0 / bc + 1) * bc;
            if self.diagonal_alone(span) && self.c.causal_offset() >= 0 && merged <= self.score_tile_cols() {
                // The min only tells the verifier's interval bounds that the block stays
                // inside the keys.
                let start = min_idx(&(&clear_all * bc), &idx((self.c.n_k - merged) as i64));
                prev = vec![self.key_block(task, &start, merged, &prev, BlockMask::Diagonal, span)];
                continue;
            }
            let (clear, touched) = self.block_bounds(task, full, span);
            // The sub-tile's rows see at least the blocks every row sees: [clear_all, clear)
            // whole, [clear, touched) in part. The mins only tell the verifier's interval
            // bounds that each block stays inside the keys.
            if !masked_everywhere {
                let ku = self.pb.range(&clear - &clear_all, AxisType::Reduce);
                let start = min_idx(&((&clear_all + &ku) * bc), &last_block);
                let mut after = prev.clone();
                after.push(ku.clone());
                prev = vec![self.key_block(task, &start, bc, &after, BlockMask::Clear, span).end(&[ku])];
            }
            let lo = if masked_everywhere { clear_all.clone() } else { clear.clone() };
            let kd = self.pb.range(&touched - &lo, AxisType::Reduce);
            let start = min_idx(&((&lo + &kd) * bc), &last_block);
            let mut after = prev.clone();
            after.push(kd.clone());
            let mask = if self.diagonal_alone(span) { BlockMask::Diagonal } else { BlockMask::Partial };
            prev = vec![self.key_block(task, &start, bc, &after, mask, span).end(&[kd])];
        }
        if rest == 0 {
            prev.pop().unwrap_or_else(|| sink(init))
        } else {
            self.key_block(task, &idx((full * bc) as i64), rest, &prev, BlockMask::Partial, all)
        }
    }

    /// Whether the sub-tile `span`'s masked keys are its causal diagonal block alone
    /// ([`BlockMask::Diagonal`]): [`Blocking::diagonal_in_parts`](crate::sdpa::Blocking::diagonal_in_parts)
    /// for every sub-tile one key block tall.
    fn diagonal_alone(&self, span: Span) -> bool {
        self.b.diagonal_in_parts(&self.c) && span.rows == self.b.keys && span.r0.is_multiple_of(self.b.keys)
    }

    /// Columns of the task's score tile: the widest key block it runs (a causal task's prefix
    /// blocks may be twice the others).
    pub(super) fn score_tile_cols(&self) -> usize {
        self.b.keys.max(self.b.causal_prefix_keys(&self.c)).min(self.c.n_k)
    }

    /// Full key blocks `[0, clear)` that every row of `span` sees whole (no mask needed), and
    /// `touched`: blocks from `touched` on are seen by no row of it (skipped); the blocks
    /// between need the mask. Causal rows and key lengths bound both; a bool mask or bias makes
    /// every block masked.
    pub(super) fn block_bounds(&self, task: &Task, full: usize, span: Span) -> (UOp, UOp) {
        let bc = self.b.keys as i64;
        let (mut clear, mut touched) = (idx(full as i64), idx(full as i64));
        if self.c.causal {
            let off = self.causal_offset();
            // With stacked heads (heads_per_task > 1) a span is all rows, each head's queries.
            let (first, bq) = if span.rows == self.rows {
                (task.q0.clone(), self.b.queries as i64)
            } else {
                (&task.q0 + span.r0 as i64, span.rows as i64)
            };
            // Keys every row of the span sees: j <= first + off; keys its last row sees: j < first + bq + off.
            let seen_by_all = (&first + &off + 1).maximum(idx(0));
            let seen_by_last = (&first + &off + bq).maximum(idx(0));
            clear = min_idx(&seen_by_all.idiv(bc), &clear);
            touched = min_idx(&(seen_by_last + (bc - 1)).idiv(bc), &touched);
        }
        if let Some(lens) = &self.lens {
            // Run checks every length against 0..=n_k; the clamp gives the bounds proof the same.
            let len = lens.index(&task.item).load().cast(DType::INDEX).maximum(idx(0));
            let len = min_idx(&len, &idx(self.c.n_k as i64));
            clear = min_idx(&len.idiv(bc), &clear);
            touched = min_idx(&(len + (bc - 1)).idiv(bc), &touched);
        }
        if let Some(len) = &self.kv_length {
            clear = min_idx(&len.idiv(bc), &clear);
            touched = min_idx(&(len + (bc - 1)).idiv(bc), &touched);
        }
        if self.mask.is_some() {
            clear = idx(0);
        }
        (clear, touched)
    }

    /// How far keys run ahead of queries under the causal mask (query `i` sees keys
    /// `j <= i + offset`): `n_k - n_q`, or `L - n_q` for a runtime KV length `L`.
    pub(super) fn causal_offset(&self) -> UOp {
        match &self.kv_length {
            Some(len) => len - self.c.n_q as i64,
            None => idx(self.c.causal_offset()),
        }
    }
}
