//! One key block of a task: the score GEMM, the mask loop, the online-softmax tile update
//! and the `P · V` GEMM.

use super::{BlockMask, SdpaKernel, Span, Task};
use crate::LOG2E;
use crate::sdpa::flex::{KeyBounds, placeholders};
use crate::sdpa::score_forms::{Ramp, RampSlope};
use crate::sdpa::{Blocking, MaskKind, SdpaConfig};
use uopc_ir::{AxisType, DType, GemmShape, Half, TileOp, UOp, f32c, idx, tile};

impl SdpaKernel {
    /// One key block of `cols` keys starting at key `first`, for the rows `span` of the task,
    /// after the effects `prev`: the score GEMM, the mask loop unless `mask` is
    /// [`BlockMask::Clear`], the softmax tile update and the `P · V` GEMM. On a
    /// [`BlockMask::Diagonal`] block both GEMMs skip what lies above the diagonal, in
    /// [`Blocking::diagonal_parts`] parts: `P · V` by rows, each part over the keys its last
    /// row sees; the scores the same way when K comes in panels, else by key columns (the keys
    /// every row sees, then each part of the diagonal's keys for the rows that see it), so no
    /// key is packed twice. The scores they skip are the mask loop's to set to `-inf` (it
    /// writes without reading), and their probabilities are 0.
    pub(super) fn key_block(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        prev: &[UOp],
        mask: BlockMask,
        span: Span,
    ) -> UOp {
        // A score function rewrites every block's scores, the blocks every row sees whole too.
        let scored = self.mods.as_ref().is_some_and(|(m, _)| m.has_score());
        let mask = if mask == BlockMask::Clear && scored { BlockMask::ScoreOnly } else { mask };
        let d = self.c.d;
        let [_, _, ksn] = self.views.k.strides;
        let [qsb, qsh, qsn] = self.views.q.strides;
        let (q_off, k_off, v_off) = (self.views.q.offset as i64, self.views.k.offset, self.views.v.offset);
        let Span { r0, rows } = span;
        let (at_d, at_s) = ((r0 * d) as i64, (r0 * cols) as i64);
        // The query rows: the task's tile, or (one head per task) rows `q0 + r0 ..` of q.
        let (query_buf, query_at, lda) = match &task.qt {
            Some(qt) => (qt.after(prev), idx(at_d), d),
            None => {
                let at = &task.item * qsb + &task.head0 * qsh + (&task.q0 + r0 as i64) * qsn + q_off;
                (self.q.clone(), at, qsn)
            }
        };
        let parts = if mask == BlockMask::Diagonal { self.b.diagonal_parts } else { 1 };
        let (mut scores, mut pv) = block_gemms(rows, cols, d, lda, ksn);
        let kv_at = &task.kv_base + first * ksn;
        let (keys, values) = match (&self.panels, &task.panel_base) {
            (Some(panels), Some((k0, v0))) => {
                // The keys' panels from the block's first, laid out as packed.
                let (kp, vp) = (panels.keys(cols), panels.values());
                let b_pair_panels = panels.pairs;
                scores = GemmShape {
                    b_trans: false,
                    ldb: kp.panel_stride,
                    b_panel_width: kp.width,
                    b_pair_panels,
                    ..scores
                };
                pv = GemmShape { ldb: vp.panel_stride, b_panel_width: vp.width, b_pair_panels, ..pv };
                let (k_at, v_at) = panels.block_offsets(first);
                (self.k.index(k0 + k_at), self.v.index(v0 + v_at))
            }
            _ => (self.k.index(&kv_at + k_off as i64), self.v.index(&kv_at + v_off as i64)),
        };
        // Both GEMMs' pieces (first row, rows, first key, keys) of the span. A staircase of K
        // and V read in place goes by key columns, the keys every row sees first, so each key
        // is packed once; from panels (nothing to pack) it goes by row parts, whose pieces all
        // start at the block's first key (longer sums per `P · V` GEMM).
        let pieces = staircase(parts, rows, cols, self.panels.is_none());
        // Pieces past the block's first key read K and V in place (`kv_at`), never panels.
        debug_assert!(self.panels.is_none() || pieces.iter().all(|&(_, _, key0, _)| key0 == 0));
        let mut g1: Option<UOp> = None;
        for &(pr0, m, key0, n) in &pieces {
            let b = if key0 == 0 { keys.clone() } else { self.k.index(&kv_at + (k_off + key0 * ksn) as i64) };
            let c = match &g1 {
                None => task.si.after(prev),
                Some(g) => task.si.after(std::slice::from_ref(g)),
            };
            let at = at_s + (pr0 * cols + key0) as i64;
            let gemm = tile(
                TileOp::Gemm(GemmShape { m, n, ..scores }),
                &[query_buf.index(&query_at + (pr0 * lda) as i64), b, c.index(at)],
            );
            g1 = Some(if let Some(op) = self.softcap_piece((m, n, cols)) {
                tile(op, &[task.si.after(std::slice::from_ref(&gemm)).index(at)])
            } else if let Some(ops) = self.ramp_piece(task, &gemm, first, (r0, pr0, key0), (m, n, cols)) {
                // One stacked head's rows after another, each op after the one before.
                ops.into_iter().fold(gemm.clone(), |prev, (op, row, slope, origin)| {
                    let rows_at = task.si.after(std::slice::from_ref(&prev)).index(at + (row * cols) as i64);
                    tile(op, &[rows_at, slope, origin])
                })
            } else {
                gemm
            });
        }
        let mut g1 = g1.expect("a block of at least one key");
        // Unscaled queries (16-bit attention's exact tile, or q read in place) have the
        // softmax step scale the f32 scores, except after a mask loop that reads every score:
        // that loop scales them before adding the bias. The suffix form, which writes -inf
        // without reading, leaves the scaling to the softmax step, which keeps -inf only for a
        // positive scale.
        let qscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        // A soft-capping or ramp score function leaves the scores scaled (see `softcap_piece`
        // and `ramp_piece`).
        let unscaled = self.queries_unscaled() && self.softcap.is_none() && self.ramp.is_none();
        let mut softmax_scale = if unscaled { qscale } else { 1.0 };
        if mask != BlockMask::Clear {
            // Mods' mask loops read every score, as a bool mask's or a bias's does, unless the
            // mask is only key bounds (see `mask_outside_bounds`).
            let reads_all = self.mask.is_some() || (self.mods.is_some() && !self.mask_is_bounds());
            let scaled_by_loop = unscaled && (reads_all || qscale <= 0.0);
            if scaled_by_loop {
                softmax_scale = 1.0;
            }
            let keys_masked = mask != BlockMask::ScoreOnly;
            g1 = self.mask_block(task, first, cols, g1, span, scaled_by_loop.then_some(qscale), keys_masked);
        }
        let after_g1 = std::slice::from_ref(&g1);
        let mut state = prev.to_vec();
        state.push(g1.clone());
        let scores_in = task.si.after(after_g1).index(at_s);
        let mut operands = vec![
            scores_in.clone(),
            task.mi.after(&state).index(r0 as i64),
            task.li.after(&state).index(r0 as i64),
            task.oi.after(&state).index(at_d),
        ];
        let update = match (self.half, &task.pi) {
            // bf16 P is rounded to bf16 into a tile of its own for a bf16 GEMM that takes both
            // operands in bf16 (natively, where AMX or vdpbf16ps runs it), as that GEMM
            // requires. Where the GEMMs widen or read f32 panels, P stays f32 over the scores,
            // as f16's does, and the f32 x 16-bit (or f32 panel) GEMM reads it: rounding P there
            // would cost a pass and lose precision for no operand that needs it.
            (Some(DType::BF16), Some(pi)) => {
                operands.push(pi.after(&state).index(at_s));
                TileOp::SoftmaxUpdateRounded {
                    rows,
                    cols,
                    lds: cols,
                    d,
                    ldo: d,
                    ldp: cols,
                    scale: softmax_scale.to_bits(),
                    round_to: Half::Bf16,
                }
            }
            _ => TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d, scale: softmax_scale.to_bits() },
        };
        let sm = tile(update, &operands);
        let after_sm = std::slice::from_ref(&sm);
        // P: the bf16 tile, or the f32 score tile the softmax step overwrote.
        let probs = task.pi.as_ref().unwrap_or(&task.si);
        // `P · V` over the same pieces, each after the one before.
        let mut done: Option<UOp> = None;
        for &(pr0, m, key0, keys) in &pieces {
            let b =
                if key0 == 0 { values.clone() } else { self.v.index(&kv_at + (v_off + key0 * ksn) as i64) };
            let out = match &done {
                None => task.oi.after(after_sm),
                Some(g) => task.oi.after(std::slice::from_ref(g)),
            };
            done = Some(tile(
                TileOp::Gemm(GemmShape { m, k: keys, ..pv }),
                &[
                    probs.after(after_sm).index(at_s + (pr0 * cols + key0) as i64),
                    b,
                    out.index(at_d + (pr0 * d) as i64),
                ],
            ));
        }
        done.expect("a block of at least one key")
    }

    /// Whether the score GEMM reads unscaled queries (16-bit attention's exact tile, or q read
    /// in place), so its scores still lack the scale.
    fn queries_unscaled(&self) -> bool {
        self.half.is_some() || self.q_in_place
    }

    /// The natural score one unit of a fresh score tile stands for: the scale where the
    /// queries are read unscaled, `ln 2` where they come scaled by the scale in base 2.
    fn natural_per_tile_unit(&self) -> f64 {
        if self.queries_unscaled() { f64::from(self.c.effective_scale()) } else { std::f64::consts::LN_2 }
    }

    /// The soft-capping tile op over the `rows x keys` piece of the score tile (row stride
    /// `ld`) that a score GEMM just wrote, when the score function is a soft-cap: only the
    /// scores the GEMMs computed are read. The tile holds the natural score `s` over the
    /// scale (queries read unscaled) or over `ln 2` (queries scaled by the scale in base 2);
    /// the capped scores go back scaled and in base 2, so neither the mask loop nor the
    /// softmax step scales them again.
    fn softcap_piece(&self, (rows, keys, ld): (usize, usize, usize)) -> Option<TileOp> {
        let cap = self.softcap?;
        let natural = self.natural_per_tile_unit();
        Some(TileOp::Softcap {
            rows,
            cols: keys,
            ld,
            inner: ((cap.inner * natural) as f32).to_bits(),
            outer: ((cap.outer * LOG2E) as f32).to_bits(),
        })
    }

    /// The score-ramp tile ops over the `rows x keys` piece of the score tile (row stride
    /// `ld`) that starts `pr0` rows into the span at task row `r0` and at key `first + key0`,
    /// when the score function is a ramp (ALiBi): `s + a (kv - q)` on the natural score, given
    /// back scaled and in base 2 as [`Self::softcap_piece`] gives its own. One op per stacked
    /// head whose rows the piece holds, each as (op, its first row in the piece, the slope: the
    /// capture's element at that head or the constant in the task's scalars, its `first key -
    /// first query` in the task's scalars); the scalars are stored after the piece's `gemm`, so
    /// after the previous piece's ops read them.
    fn ramp_piece(
        &self,
        task: &Task,
        gemm: &UOp,
        first: &UOp,
        (r0, pr0, key0): (usize, usize, usize),
        (rows, keys, ld): (usize, usize, usize),
    ) -> Option<Vec<(TileOp, usize, UOp, UOp)>> {
        let mods = self.ramp.as_ref()?;
        let (_, buffers) = self.mods.as_ref()?;
        let scalars = task.ri.as_ref()?;
        let [_, _, q, kv] = placeholders();
        // A stand-in for the score, loaded from a slot no kernel has, so no load the function
        // makes of the kernel's own buffers can be taken for it.
        let s = uopc_ir::buffer(usize::MAX >> 1, DType::F32, 1).index(idx(0)).load();
        let natural = self.natural_per_tile_unit();
        let op = |rows| TileOp::ScoreRamp {
            rows,
            cols: keys,
            ld,
            scale: ((natural * LOG2E) as f32).to_bits(),
            slope_scale: (LOG2E as f32).to_bits(),
        };
        let before = scalars.after(std::slice::from_ref(gemm));
        let (gs, bq) = (self.b.heads_per_task, self.b.queries);
        // Tile row `t` of the span is query `q0 + r0 + t` of the task's one head, or (stacked
        // heads, whose span is the whole tile) query `q0 + t % bq` of head `head0 + t / bq`.
        let per_head = if gs == 1 { usize::MAX } else { bq };
        let mut stores = Vec::new();
        let mut parts = Vec::new();
        for hh in 0..gs {
            let (lo, hi) = ((hh * per_head).max(pr0), ((hh + 1) * per_head).min(pr0 + rows));
            if lo >= hi {
                continue;
            }
            let query = if gs == 1 { r0 + lo } else { lo - hh * bq };
            let origin = (first + key0 as i64 - (&task.q0 + query as i64)).cast(DType::F32);
            stores.push(before.index(idx(1 + hh as i64)).store(origin));
            let head = &task.head0 + hh as i64;
            let (f, _, _) = mods.build((&task.item, &head, &q, &kv), buffers, Some(&s));
            parts.push((hh, lo, hi, Ramp::slope(&f?, &s, &q, &kv)?));
        }
        let constant = parts.iter().find_map(|p| match p.3 {
            RampSlope::Constant(c) => Some(c),
            RampSlope::Read(_) => None,
        });
        if let Some(c) = constant {
            stores.push(before.index(idx(0)).store(f32c(c as f32)));
        }
        let ready = scalars.after(&stores);
        let ops = parts
            .into_iter()
            .map(|(hh, lo, hi, slope)| {
                let slope_at = match slope {
                    RampSlope::Read(at) => at,
                    RampSlope::Constant(_) => ready.index(idx(0)),
                };
                (op(hi - lo), lo - pr0, slope_at, ready.index(idx(1 + hh as i64)))
            })
            .collect();
        Some(ops)
    }

    /// The loop over a score tile (after `scores`) that adds the bias and sets the keys a row
    /// does not see to `-inf`: causal, past the item's key length, or false in the bool mask.
    /// Only the rows `span` of the tile are touched (all of them with stacked heads). With
    /// `scale`, every score of the rows is multiplied by it first (unscaled scores: 16-bit
    /// attention's, or those of queries read in place). With attention mods, the score
    /// function rewrites each score and the mask function joins the masks. Without
    /// `keys_masked` (a block every row sees whole) nothing is masked: only the score function
    /// runs.
    #[allow(clippy::too_many_arguments)] // the block, its rows and what the loop does to them
    pub(super) fn mask_block(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        scores: UOp,
        span: Span,
        scale: Option<f32>,
        keys_masked: bool,
    ) -> UOp {
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        // A sub-tile is a span of one head's query rows (heads_per_task is 1 then).
        let (r0, bq) = if span.rows == self.rows { (0, bq) } else { (span.r0, span.rows) };
        if self.mask.is_none() && scale.is_none() && self.mods.is_none() {
            return self.mask_suffix(task, first, cols, scores, Span { r0, rows: bq });
        }
        if self.mask.is_none()
            && scale.is_none()
            && keys_masked
            && self.mask_is_bounds()
            && let Some(done) =
                self.mask_outside_bounds(task, first, cols, scores.clone(), Span { r0, rows: bq }, true)
        {
            return done;
        }
        let pb = &mut self.pb;
        let hh = pb.range(gs, AxisType::Loop);
        let rq = pb.range(bq, AxisType::Loop);
        let cc = pb.range(cols, AxisType::Loop);
        let cell = task.si.after(&[scores]).index((&hh * bq + &rq + r0 as i64) * cols + &cc);
        let key = first + &cc;
        let query = &task.q0 + &rq + r0 as i64;
        let mut score = match scale {
            Some(s) => cell.load() * s,
            None => cell.load(),
        };
        let mut keep: Vec<UOp> = self.key_ends(task, &query).iter().map(|end| key.lt(end)).collect();
        if let Some((buf, shape)) = &self.mask {
            let [sb, sh, sq, sk] = SdpaConfig::mask_strides(*shape);
            let at = &task.item * sb + (&task.head0 + &hh) * sh + &query * sq + &key * sk;
            let x = buf.index(at).load();
            match self.c.mask {
                MaskKind::Bool(_) => keep.push(x),
                _ => score = score + x * (LOG2E as f32),
            }
        }
        if let Some((mods, buffers)) = &self.mods {
            // The functions see the scaled score in natural units and give one back; the tile
            // holds base-2 scores.
            let natural = &score * std::f32::consts::LN_2;
            let head = &task.head0 + &hh;
            let (modified, mask, _) = mods.build((&task.item, &head, &query, &key), buffers, Some(&natural));
            if let Some(s) = modified {
                score = s.cast(DType::F32) * (LOG2E as f32);
            }
            keep.extend(mask);
        }
        if !keys_masked {
            keep.clear();
        }
        for c in keep {
            score = c.where_(&score, f32c(f32::NEG_INFINITY));
        }
        cell.store(score).end(&[cc, rq, hh])
    }

    /// [`Self::mask_block`] without a bool mask or bias: each row of the tile (rows `r0 .. r0 +
    /// rows` of each stacked head) sees the keys below one bound (its causal limit, the KV
    /// length, the item's key length, whichever is least), so only the row's masked suffix
    /// of the block is touched, set to `-inf` without reading it (a compare and select per
    /// score cost about 4% of a causal run, its diagonal blocks' GEMMs taking little more).
    pub(super) fn mask_suffix(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        scores: UOp,
        span: Span,
    ) -> UOp {
        self.mask_outside_bounds(task, first, cols, scores, span, false).expect("ends alone are exact")
    }

    /// The ends of the keys the row of query `query` may see, whatever the mask: its causal
    /// limit, the KV length, the item's key length (those the configuration has).
    fn key_ends(&self, task: &Task, query: &UOp) -> Vec<UOp> {
        let mut ends = Vec::new();
        if self.c.causal {
            ends.push(query + &self.causal_offset() + 1);
        }
        if let Some(len) = &self.kv_length {
            ends.push(len.clone());
        }
        if let Some(lens) = &self.lens {
            ends.push(lens.index(&task.item).load().cast(DType::INDEX));
        }
        ends
    }

    /// Whether the mods have no score function and their mask is only bounds on the key (see
    /// [`KeyBounds`]: a window, a prefix, a causal limit, unions of such), which
    /// [`Self::mask_outside_bounds`] applies without reading the scores.
    fn mask_is_bounds(&self) -> bool {
        self.mods.as_ref().is_some_and(|(m, _)| {
            !m.has_score() && m.mask_analysis().is_some_and(|a| a.bounds.exact && a.bounds.is_bounded())
        })
    }

    /// [`Self::mask_suffix`] with the key bounds of the mods' mask too (`with_mods`, for a mask
    /// that is only bounds): each row of the tile sees the keys from its greatest start to its
    /// least end, so only the row's masked prefix and suffix of the block are set to `-inf`,
    /// without reading or evaluating a score; the softmax step scales the scores. `None` when
    /// the mask's bounds at these rows are not the whole mask (the caller then runs the mask
    /// loop); the scores as they are when no row has a bound.
    fn mask_outside_bounds(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        scores: UOp,
        span: Span,
        with_mods: bool,
    ) -> Option<UOp> {
        let gs = self.b.heads_per_task;
        let Span { r0, rows } = span;
        let hh = self.pb.range(gs, AxisType::Loop);
        let rq = self.pb.range(rows, AxisType::Loop);
        let query = &task.q0 + &rq + r0 as i64;
        let mut bounds = KeyBounds::default();
        if let Some((mods, buffers)) = self.mods.as_ref().filter(|_| with_mods) {
            let kv = placeholders()[3].clone();
            let (_, mask, _) = mods.build((&task.item, &(&task.head0 + &hh), &query, &kv), buffers, None);
            bounds = KeyBounds::of(&mask?, &kv);
            if !bounds.exact {
                return None;
            }
        }
        bounds.end.extend(self.key_ends(task, &query));
        let (seen_from, seen_to) = bounds.block_columns(first, cols);
        let row_at = (&hh * rows as i64 + &rq + r0 as i64) * cols as i64;
        // The prefix's loop, then the suffix's after it (the two overlap on a row that sees
        // none of the block); the last one ends the row loops.
        let mut tile = task.si.after(&[scores.clone()]);
        let mut last: Option<(UOp, UOp)> = None;
        if let Some(from) = seen_from {
            let rc = self.pb.range(from, AxisType::Loop);
            last = Some((tile.index(&row_at + &rc).store(f32c(f32::NEG_INFINITY)), rc));
        }
        if let Some(to) = seen_to {
            if let Some((prefix, rc)) = last.take() {
                tile = task.si.after(&[prefix.end(&[rc])]);
            }
            // Counted down from the last column, so every index is inside the row whatever the
            // suffix's length (the verifier's intervals cannot tie the column to the bound).
            let rc = self.pb.range(-&to + cols as i64, AxisType::Loop);
            let cell = tile.index(&row_at + (-&rc + (cols as i64 - 1)));
            last = Some((cell.store(f32c(f32::NEG_INFINITY)), rc));
        }
        Some(match last {
            Some((store, rc)) => store.end(&[rc, rq, hh]),
            None => scores,
        })
    }
}

/// The GEMM pieces `(first row, rows, first key, keys)` of a block of `cols` keys for `rows`
/// rows that see every key but the last `rows`, and of those the `r`-th up to row `r` (a
/// diagonal block), in `parts` parts: by rows, part `p` over the keys its last row sees; or
/// `by_columns`, the keys every row sees, then part `c` of the diagonal's keys for the rows
/// from the `c`-th part on. One part is the whole block.
fn staircase(parts: usize, rows: usize, cols: usize, by_columns: bool) -> Vec<(usize, usize, usize, usize)> {
    let seen = cols - rows.min(cols);
    let bounds = |p: usize| (p * rows / parts, (p + 1) * rows / parts);
    if parts <= 1 {
        vec![(0, rows, 0, cols)]
    } else if by_columns {
        let whole = (seen > 0).then_some((0, rows, 0, seen));
        let diagonal = (0..parts).map(bounds).map(|(lo, hi)| (lo, rows - lo, seen + lo, hi - lo));
        whole.into_iter().chain(diagonal).collect()
    } else {
        (0..parts).map(bounds).map(|(lo, hi)| (lo, hi - lo, 0, seen + hi)).collect()
    }
}

/// The two GEMMs of a key block read in place, for `rows` query rows (`lda` apart) and `cols`
/// keys of head dimension `d` (`ksn` apart in K and V): the scores `Q K^T` into a dense
/// `rows x cols` tile, and `P V` accumulated into the dense `rows x d` output tile.
fn block_gemms(rows: usize, cols: usize, d: usize, lda: usize, ksn: usize) -> (GemmShape, GemmShape) {
    let scores = GemmShape { lda, ldb: ksn, ..GemmShape::dense(rows, cols, d, false, true, false) };
    let pv = GemmShape { ldb: ksn, ..GemmShape::dense(rows, d, cols, false, false, true) };
    (scores, pv)
}

#[cfg(test)]
mod tests {
    use super::staircase;

    /// Both forms of the staircase compute every (row, key) pair a row sees exactly once, and
    /// of the pairs above the diagonal only those inside a part's square.
    #[test]
    fn staircase_pieces_cover_what_each_row_sees_once() {
        for (rows, cols) in [(64, 64), (64, 128), (16, 48), (7, 7), (5, 12)] {
            for parts in [1, 2, 3, 4, 5] {
                for by_columns in [false, true] {
                    let mut count = vec![0u32; rows * cols];
                    for (r0, m, k0, n) in staircase(parts, rows, cols, by_columns) {
                        assert!(r0 + m <= rows && k0 + n <= cols, "{rows}x{cols}/{parts}");
                        for r in r0..r0 + m {
                            for k in k0..k0 + n {
                                count[r * cols + k] += 1;
                            }
                        }
                    }
                    let seen = cols - rows;
                    for r in 0..rows {
                        for k in 0..cols {
                            let c = count[r * cols + k];
                            if k <= seen + r {
                                assert_eq!(c, 1, "{rows}x{cols}/{parts} {by_columns}: ({r}, {k})");
                            } else {
                                assert!(c <= 1, "{rows}x{cols}/{parts} {by_columns}: ({r}, {k})");
                            }
                        }
                    }
                    // More parts skip more: at most a part's square above the diagonal per part.
                    let wasted: u32 = (0..rows)
                        .flat_map(|r| ((seen + r + 1)..cols).map(move |k| (r, k)))
                        .map(|(r, k)| count[r * cols + k])
                        .sum();
                    let per_part = rows.div_ceil(parts);
                    assert!(wasted as usize <= parts * per_part * per_part, "{rows}x{cols}/{parts}");
                }
            }
        }
    }
}
