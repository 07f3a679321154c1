//! The FlashAttention-2 loop program of [`super`] for a configuration and its [`Blocking`].

mod flex_loops;
mod flex_plan;
pub(crate) use flex_loops::extreme_over_rows;
pub use flex_loops::flex_block_plan;
pub use flex_plan::sdpa_flex_plan_ir;
pub(crate) use flex_plan::{PlanMode, count_pairs, plan_from_counts};
mod key_block;
mod key_loops;
mod task;

use super::flex::Reads;
use super::panels::KvPanels;
use super::score_forms::{Ramp, Softcap};
use super::views::Views;
use super::{AttentionMods, Blocking, MaskKind, SdpaConfig};
use crate::masked::min_idx;
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, idx, var};

/// FlashAttention-2 on tile ops for `config` with block sizes `blocking`.
///
/// Buffers: 0 = q, 1 = k, 2 = v, 3 = output (lengths [`SdpaConfig::q_len`] and
/// [`SdpaConfig::kv_len`], laid out as [`SdpaConfig::layout`], of [`SdpaConfig::dtype`]); then, in this order, the mask
/// or bias (its broadcast shape's element count) and the `batch` i32 key lengths, if any.
/// With [`Blocking::kv_panel_width`] set, slots 1 and 2 instead hold each key/value head's
/// keys and values packed into panels of that width, as [`Sdpa::run`](super::Sdpa::run) packs
/// them (`uopc_tile::pack_panels`): per head, `K^T` in panels of keys, then (in slot 2) V in
/// panels of head dimensions.
/// With `blocking.splits > 1`, slots 3, 4 and 5 are instead the partial states of the tasks
/// for [`super::sdpa_merge_ir`]: output rows (`tasks x rows x D`), running maxima and running
/// sums (`tasks x rows` each), and the mask and key lengths follow from slot 6.
///
/// One THREAD task per (batch item, key/value head, group of query heads, query block): with
/// one f32 query head per task its score GEMMs read the query rows in q and the softmax step
/// multiplies the scores by `scale * log2(e)` (so the softmax works in base 2); with stacked
/// heads it first copies its query rows, times that factor, into a stack tile (evenly strided
/// rows for the GEMM). It then streams the keys of
/// its key/value head in blocks: a tile GEMM for the scores, the mask loop where the block can
/// be partly masked, the online-softmax tile update (one rescale of the output tile per block)
/// and a tile GEMM `O += P · V`. Keys past the last full block go in one narrower block. Under
/// the causal mask, blocks every row sees run unmasked, blocks after the last row's last key
/// are skipped, and only the blocks in between are masked; a task of one head's queries
/// taller than 64 rows runs that diagonal band in sub-tiles of 64 rows, each over the blocks
/// its rows see (so it does the work of 64-row tasks, with the blocks below the band packed
/// once per task, and run two key blocks at a time when the wider score tile fits). When a
/// sub-tile's masked keys are its diagonal block alone ([`Blocking::diagonal_in_parts`]), that
/// block's GEMMs run as a staircase of parts that skip the keys above the diagonal, and
/// with the keys at or ahead of the queries the sub-tile's other blocks join it in one block
/// when the score tile is that wide. With key lengths, blocks past the item's length are
/// skipped and only the block holding its end is masked. Without a bool mask or bias, the mask loop writes `-inf`
/// over each row's masked suffix of the block only. With a 16-bit dtype the query rows are
/// read in place ([`Blocking::reads_queries_in_place`]) or copied unscaled and exactly (bf16 ones for bf16 GEMMs as bf16, f16 ones and bf16 ones
/// whose GEMMs widen to f32 once per task by a block conversion, so each key block's score
/// GEMM widens only the keys), the GEMMs take the 16-bit keys and
/// values (f32 scores and output tile), and the softmax step scales the scores (unless a mask
/// loop that reads every score already did) and writes P: for bf16 whose GEMM takes both
/// operands in bf16
/// ([`TileOp::SoftmaxUpdateRounded`](uopc_ir::TileOp::SoftmaxUpdateRounded)) rounded to bf16,
/// into a tile of its own for `P · V`; otherwise as f32 over the scores (the f32 x 16-bit GEMM,
/// or the f32 GEMM of V's panels, reads its A in place); the output is rounded
/// once when stored (by a block conversion when the task owns contiguous output rows). The last query
/// block starts early enough to be full (it overlaps the previous one) and writes only its own
/// rows. Split-K tasks run the blocks of their key chunk; the last chunk also takes the narrow
/// block.
pub fn sdpa_ir(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, false, false, None, None).program()
}

/// [`sdpa_ir`] with the output in the last slot, after the mask or bias and the key lengths
/// (the order of a tensor graph's kernel node: sources, then the output), q, k, v and the
/// output where `views` places them in their slots (densely packed in the configuration's
/// layout when `None`; checked by [`Views::check`]). `blocking.splits` must be 1 and
/// `blocking.kv_panel_width` 0.
pub(crate) fn sdpa_ir_output_last(config: &SdpaConfig, blocking: &Blocking, views: Option<Views>) -> UOp {
    SdpaKernel::new(config, blocking, true, false, None, views).program()
}

/// [`sdpa_ir_output_last`] whose output is two consecutive slots: the attention output, then
/// each query row's base-2 log-sum-exp (as [`sdpa_ir_with_lse`] stores it).
pub(crate) fn sdpa_ir_output_last_with_lse(
    config: &SdpaConfig,
    blocking: &Blocking,
    views: Option<Views>,
) -> UOp {
    SdpaKernel::new(config, blocking, true, true, None, views).program()
}

/// [`sdpa_ir`] that also stores each query row's base-2 log-sum-exp, what the backward pass
/// recomputes the probabilities from: `lse2 = m + log2(l)` over the row's base-2 scores
/// `scale * log2(e) * q · k` (plus `log2(e) * bias`), with `m` their maximum and `l` the sum
/// of `exp2(score - m)` over the keys the row sees; `-inf` for a row that sees no key.
///
/// The lse buffer comes after every buffer of [`sdpa_ir`]: `batch * heads * n_q` f32s laid
/// out `(batch, head, row)`, whatever the layout of q.
pub fn sdpa_ir_with_lse(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, false, true, None, None).program()
}

/// [`sdpa_ir`] with attention mods ([`AttentionMods`]): their score and mask functions run in
/// the mask loop of every key block that needs them, blocks the mask's key bounds exclude are
/// skipped, blocks every row sees whole run the score function alone, and sinks join each
/// row's sum before the output is written. The captured tensors' buffers come after the key
/// lengths, in declaration order. `blocking.splits` must be 1, and the configuration has no
/// bool mask or bias (the mods express them).
pub fn sdpa_flex_ir(config: &SdpaConfig, blocking: &Blocking, mods: &AttentionMods) -> UOp {
    SdpaKernel::new(config, blocking, false, false, Some(mods), None).program()
}

/// [`sdpa_flex_ir`] that also stores each query row's base-2 log-sum-exp, sinks included (as
/// [`sdpa_ir_with_lse`]), in a buffer after every other one (the per-run plan's included).
pub(crate) fn sdpa_flex_ir_with_lse(config: &SdpaConfig, blocking: &Blocking, mods: &AttentionMods) -> UOp {
    SdpaKernel::new(config, blocking, false, true, Some(mods), None).program()
}

struct SdpaKernel {
    c: SdpaConfig,
    b: Blocking,
    rows: usize,
    /// Where q, k, v and the output lie in their slots.
    views: Views,
    q: UOp,
    k: UOp,
    v: UOp,
    out: UOp,
    /// Split-K partial states: maxima and sums (the output rows go to `out`).
    partial: Option<(UOp, UOp)>,
    mask: Option<(UOp, [usize; 4])>,
    lens: Option<UOp>,
    /// The current KV length, a runtime variable in `0..=n_k`, with
    /// [`SdpaConfig::runtime_kv_length`].
    kv_length: Option<UOp>,
    /// Where each query row's base-2 log-sum-exp is stored, when the backward needs it.
    lse: Option<UOp>,
    /// The 16-bit dtype of q, k, v and the output, when not f32.
    half: Option<DType>,
    /// The score GEMM reads q itself ([`Blocking::reads_queries_in_place`]).
    q_in_place: bool,
    /// Where k and v lie in panels, with [`Blocking::kv_panel_width`].
    panels: Option<KvPanels>,
    /// Score and mask functions, sinks, and their captured tensors' buffers; without the score
    /// function when `softcap` runs it.
    mods: Option<(AttentionMods, Vec<UOp>)>,
    /// The score function when it is a soft-cap, run by the soft-capping tile op on each
    /// block's scores right after the score GEMM.
    softcap: Option<Softcap>,
    /// The mods with their score function when it is a ramp (ALiBi, [`Ramp`]), run by the
    /// score-ramp tile op on each block's scores right after the score GEMM (once per stacked
    /// head, whose rows share a slope).
    ramp: Option<AttentionMods>,
    /// The per-run block plan's buffer (`[t0, c0, c1, t1]` per unit, i32) and whether its units
    /// are tasks (else query blocks of an item), for mods whose mask bounds are not exact.
    flex_plan: Option<(UOp, bool)>,
    pb: ProgramBuilder,
}

/// How the keys of one key block are masked for the rows of its span.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockMask {
    /// Every row sees every key: no mask loop.
    Clear,
    /// Rows may see some keys only: the mask loop runs over the block.
    Partial,
    /// Every row sees every key, and a score function rewrites the scores: the mask loop runs
    /// without masking.
    ScoreOnly,
    /// The causal diagonal and nothing else: every row of the span sees the block's keys but
    /// its last `span.rows`, and row `r` sees those up to the `r`-th. The mask loop runs, and
    /// the GEMMs skip the parts of the block wholly above the diagonal.
    Diagonal,
}

impl BlockMask {
    /// [`BlockMask::Partial`] when `masked`, else [`BlockMask::Clear`].
    fn partial_if(masked: bool) -> BlockMask {
        if masked { BlockMask::Partial } else { BlockMask::Clear }
    }
}

/// Rows `r0 .. r0 + rows` of a task's tiles (all of them, or one causal sub-tile).
#[derive(Clone, Copy)]
struct Span {
    r0: usize,
    rows: usize,
}

/// The THREAD task's indices and scratch views, shared by the parts of the program.
struct Task {
    t: UOp,
    split: UOp,
    item: UOp,
    kv_base: UOp,
    /// The task's key/value head's first element in the panel buffers (`k`, `v`), when K and
    /// V come packed.
    panel_base: Option<(UOp, UOp)>,
    head0: UOp,
    q0: UOp,
    qblk: UOp,
    /// The scaled query tile, unless the score GEMM reads q in place.
    qt: Option<UOp>,
    si: UOp,
    oi: UOp,
    mi: UOp,
    li: UOp,
    /// The rounded probabilities of bf16 attention (f16 writes its f32 ones over the scores).
    pi: Option<UOp>,
    /// The score-ramp tile op's scalars (a constant slope, then each stacked head's origin),
    /// with a ramp.
    ri: Option<UOp>,
}

impl SdpaKernel {
    fn new(
        config: &SdpaConfig,
        blocking: &Blocking,
        output_last: bool,
        save_lse: bool,
        mods: Option<&AttentionMods>,
        views: Option<Views>,
    ) -> Self {
        let c = *config;
        let f32t = DType::F32;
        let el = c.dtype.dtype();
        let rows = blocking.rows();
        let views = views.unwrap_or_else(|| Views::dense(config));
        let q = buffer(0, el, views.q.len);
        let panels = blocking.kv_panels(config);
        let (k, v) = match &panels {
            None => (buffer(1, el, views.k.len), buffer(2, el, views.v.len)),
            Some(panels) => {
                let pt = if panels.pairs { DType::BF16 } else { f32t };
                (buffer(1, pt, panels.k_len()), buffer(2, pt, panels.v_len()))
            }
        };
        let (out, partial, mut slot) = if blocking.splits > 1 {
            let states = blocking.tasks(config) * rows;
            let partial = (buffer(4, f32t, states), buffer(5, f32t, states));
            (buffer(3, f32t, states * c.d), Some(partial), 6)
        } else if output_last {
            let extras = usize::from(c.mask != MaskKind::None) + usize::from(c.key_lengths);
            (buffer(3 + extras, el, views.out.len), None, 3)
        } else {
            (buffer(3, el, views.out.len), None, 4)
        };
        let mask = match c.mask {
            MaskKind::None => None,
            MaskKind::Bool(s) => Some((buffer(slot, DType::Bool, s.iter().product()), s)),
            MaskKind::Bias(s) => Some((buffer(slot, f32t, s.iter().product()), s)),
        };
        slot += usize::from(mask.is_some());
        let lens = c.key_lengths.then(|| buffer(slot, DType::I32, c.batch));
        slot += usize::from(lens.is_some());
        let softcap = mods.and_then(Softcap::of);
        let ramp = mods.filter(|m| softcap.is_none() && Ramp::of(m)).cloned();
        let without_score =
            mods.filter(|_| softcap.is_some() || ramp.is_some()).map(AttentionMods::without_score);
        // The captures the kernel reads are the whole mods' (a ramp's slopes stay in its slots).
        let used = mods.map_or(Vec::new(), |m| m.captures_read(Reads::ALL));
        let mods = without_score.as_ref().or(mods);
        let mods = mods.map(|m| (m.clone(), m.buffers_used(slot, &used)));
        slot += used.iter().filter(|&&u| u).count();
        let flex_plan = match mods.as_ref().map(|(m, _)| PlanMode::of(m)) {
            Some(mode @ PlanMode::Runtime { per_head }) => {
                let plan = buffer(slot, DType::I32, mode.units(config, blocking) * 4);
                slot += 1;
                Some((plan, per_head))
            }
            _ => None,
        };
        // After every other buffer (in the output-last form, right after the output).
        let lse_slot = if output_last { slot + 1 } else { slot };
        let lse = save_lse.then(|| buffer(lse_slot, f32t, c.batch * c.heads * c.n_q));
        let kv_length = c.runtime_kv_length.then(|| var(0, 0, c.n_k as i64));
        SdpaKernel {
            c,
            b: *blocking,
            rows,
            views,
            q,
            k,
            v,
            out,
            partial,
            mask,
            lens,
            kv_length,
            lse,
            half: (el != f32t).then_some(el),
            q_in_place: blocking.reads_queries_in_place(config),
            panels,
            mods,
            softcap,
            ramp,
            flex_plan,
            pb: ProgramBuilder::new(),
        }
    }

    fn program(mut self) -> UOp {
        let task = self.task();
        let init = self.init(&task);
        let Blocking { keys: bc, splits, .. } = self.b;
        let n_k = self.c.n_k;
        let (full, rest) = (n_k / bc, n_k % bc);
        let masked_everywhere = self.mask.is_some();
        let bounded = self.c.causal || self.lens.is_some() || self.kv_length.is_some();
        let done = if self.mods.as_ref().is_some_and(|(m, _)| m.has_mask()) {
            self.flex_key_loops(&task, &init, full, rest)
        } else if splits == 1 && !bounded {
            let kb = self.pb.range(full, AxisType::Reduce);
            let mut prev = init.clone();
            prev.push(kb.clone());
            let all = self.all_rows();
            let body = self
                .key_block(&task, &(&kb * bc), bc, &prev, BlockMask::partial_if(masked_everywhere), all)
                .end(&[kb]);
            if rest > 0 {
                self.key_block(
                    &task,
                    &idx((full * bc) as i64),
                    rest,
                    &[body],
                    BlockMask::partial_if(masked_everywhere),
                    all,
                )
            } else {
                body
            }
        } else if self.b.causal_sub_tile_rows(&self.c).is_some() {
            self.causal_sub_tiles(&task, &init, full, rest)
        } else {
            let (clear, touched) = self.block_bounds(&task, full, self.all_rows());
            // This task's blocks: [first, last) of the keys' full blocks.
            let (first, lo, hi) = if splits == 1 {
                (idx(0), clear, touched)
            } else {
                let cb = self.b.chunk_blocks(n_k);
                let first = &task.split * cb;
                let last = min_idx(&(&first + cb as i64), &idx(full as i64));
                let clamp = |x: &UOp| min_idx(&x.maximum(&first), &last);
                (first.clone(), clamp(&clear), clamp(&touched))
            };
            let last_block = idx(((full.max(1) - 1) * bc) as i64);
            let mut prev = init.clone();
            if !masked_everywhere {
                let kb = self.pb.range(if splits == 1 { lo.clone() } else { &lo - &first }, AxisType::Reduce);
                let start = if splits == 1 { &kb * bc } else { min_idx(&((&first + &kb) * bc), &last_block) };
                let mut after = prev.clone();
                after.push(kb.clone());
                prev = vec![
                    self.key_block(&task, &start, bc, &after, BlockMask::Clear, self.all_rows()).end(&[kb]),
                ];
            }
            let kd = self.pb.range(&hi - &lo, AxisType::Reduce);
            // The min only tells the verifier's interval bounds that the block stays inside
            // the keys (they do not see that kd < hi - lo).
            let start = min_idx(&((&lo + &kd) * bc), &last_block);
            prev.push(kd.clone());
            let near =
                self.key_block(&task, &start, bc, &prev, BlockMask::Partial, self.all_rows()).end(&[kd]);
            if rest == 0 {
                near
            } else if splits == 1 {
                self.key_block(
                    &task,
                    &idx((full * bc) as i64),
                    rest,
                    &[near],
                    BlockMask::Partial,
                    self.all_rows(),
                )
            } else {
                // The narrow block belongs to the last chunk: a range of one iteration there,
                // of none elsewhere.
                let tail =
                    self.pb.range((&task.split + (2 - splits as i64)).maximum(idx(0)), AxisType::Reduce);
                self.key_block(
                    &task,
                    &idx((full * bc) as i64),
                    rest,
                    &[near, tail.clone()],
                    BlockMask::Partial,
                    self.all_rows(),
                )
                .end(&[tail])
            }
        };
        // Mods' sinks join the sums (and a mask-free score function rode on the blocks above).
        let done = self.sink_step(&task, done);
        self.write(&task, &done)
    }
}
