//! The FlashAttention-2 kernel of [`super`]: block sizes and the loop program.

use super::{MaskKind, SdpaConfig, SdpaDType};
use crate::masked::min_idx;
use crate::online::LOG2E;
use uopc_ir::{AxisType, DType, GemmShape, ProgramBuilder, TileOp, UOp, buffer, f32c, idx, sink, tile, var};
use uopc_jit::MAX_LOCAL_BYTES;
/// Block sizes of one compiled attention (see [`Blocking::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Query heads of one key/value group stacked into one task's tile (they share every K/V
    /// block the task loads).
    pub heads_per_task: usize,
    /// Query rows per head in one task.
    pub queries: usize,
    /// Keys per block.
    pub keys: usize,
    /// Chunks the keys of one task's rows are split into, each its own task; above 1 the
    /// tasks write partial softmax states that [`super::sdpa_merge_ir`] combines (split-K, for
    /// decode shapes with too few rows to keep every core busy).
    pub splits: usize,
}

/// Keys per block: a 64-key block of K and V (32 KiB each at D = 128) stays in L1/L2 while both
/// GEMMs of the block read it, and 64 columns fill the score micro-kernel's 4 x 16-lane rows.
const KEY_BLOCK: usize = 64;

/// Rows per task under the causal mask. The blocks every row sees run on all rows; the
/// diagonal band runs in sub-tiles of [`CAUSAL_SUB_ROWS`] rows, each over the blocks its own
/// rows see, so the static FLOPs are those of 64-row tasks (about 0.53 of the unmasked
/// kernel's at n = 1024) while the blocks below the band pack each K/V block once per 128
/// rows.
const CAUSAL_MAX_ROWS: usize = 2 * KEY_BLOCK;

/// Rows of one sub-tile of a causal task's diagonal band: one key block, so each sub-tile has
/// a single diagonal block whose masked half is wasted.
const CAUSAL_SUB_ROWS: usize = KEY_BLOCK;

/// Stack the tiles of one task may take: the JIT's limit less room for the kernel's own frame.
const TILE_BUDGET: usize = MAX_LOCAL_BYTES - 16 * 1024;

/// Tasks per core below which the keys are split (when the rows cannot be): with four tasks
/// per core, uneven task counts leave a core idle for at most a fifth of the run.
const SPLIT_TASKS_PER_CORE: usize = 4;

/// Keys a chunk keeps at least (and at least one block), so the partial state each chunk
/// writes and the merge reads (rows x (D + 2) floats) stays small next to the chunk's K and V.
const MIN_CHUNK_KEYS: usize = 8 * KEY_BLOCK;

/// Rows per task up to which the tile GEMMs stream K and V rows straight from memory instead
/// of packing register-tile panels (the AVX-512 dot-product and row-streamed kernels).
const FEW_ROWS: usize = 8;

/// Keys per block for tasks of at most [`FEW_ROWS`] rows (decode). Such a task does little
/// arithmetic per key, so what each block costs regardless of its width (three tile calls,
/// the softmax update's per-row reductions, one rescale pass over the output tile) is a large
/// share of it; the streamed kernels read each K and V row once whatever the block's width, so
/// a wide block costs no cache reuse. The score tile stays small (rows x 512 floats).
const STREAMED_KEY_BLOCK: usize = 512;

impl Blocking {
    /// Block sizes for `config` on `cores` cores.
    ///
    /// The task's tiles (scaled Q and output, `rows x D` each, the `rows x keys` score tile,
    /// and the running max and sum; with a 16-bit dtype the query tile in that dtype and a
    /// `rows x keys` tile of rounded probabilities besides) must fit the JIT's stack limit
    /// less 16 KiB; within that, rows are as many as possible, up to 256 (a multiple of 16), because every task re-packs
    /// each K/V block it reads and taller tiles amortize that; under the causal mask at most
    /// 128, whose diagonal band runs in 64-row sub-tiles (see [`sdpa_ir`]). With fewer
    /// queries than rows, the query heads of a key/value group fill the rows (decode: one K/V pass serves the whole group). Query
    /// rows are a divisor of n_q when one lies within half of the most rows; otherwise query
    /// blocks are evened out (no mostly-empty last block); they are split further if there
    /// would be fewer tasks than cores. Keys come in blocks of 64, or of 512 when a task has at
    /// most 8 rows (those stream K and V, and a wide block spreads the per-block costs). When
    /// one query block holds all rows and there are fewer than four tasks per core, the keys
    /// are split into chunks of at least 512 keys and one block (split-K).
    pub fn choose(config: &SdpaConfig, cores: usize) -> Blocking {
        let &SdpaConfig { batch, heads, kv_heads, n_q, n_k, d, .. } = config;
        let keys = KEY_BLOCK.min(n_k);
        let per_row = tile_bytes_per_row(config.dtype, d, keys);
        let fit = (TILE_BUDGET / per_row).max(1);
        let mut max_rows = if fit >= 16 { (fit / 16 * 16).min(256) } else { fit };
        if config.causal {
            // The diagonal band of a block wastes about (rows + keys) / 2 masked pairs per row.
            max_rows = max_rows.min(CAUSAL_MAX_ROWS);
        }
        let group = heads / kv_heads;
        let (heads_per_task, mut queries) = if n_q >= max_rows {
            (1, max_rows)
        } else {
            let g = (1..=group).rev().find(|g| group.is_multiple_of(*g) && g * n_q <= max_rows).unwrap_or(1);
            (g, n_q)
        };
        if heads_per_task == 1
            && let Some(rows) = (max_rows.div_ceil(2)..=max_rows).rev().find(|r| n_q.is_multiple_of(*r))
        {
            // Rows that divide n_q exactly: no overlapping last block, and each task's output
            // rows are contiguous, so the tasks are proven disjoint and run in parallel.
            queries = rows;
        }
        let mut blocks = n_q.div_ceil(queries);
        let tasks = batch * kv_heads * (group / heads_per_task) * blocks;
        if tasks < cores {
            blocks = (blocks * cores.div_ceil(tasks)).min(n_q);
        }
        queries = n_q.div_ceil(blocks);
        let tasks = batch * kv_heads * (group / heads_per_task) * n_q.div_ceil(queries);
        let rows = heads_per_task * queries;
        let wide = STREAMED_KEY_BLOCK.min(n_k);
        let keys = if rows <= FEW_ROWS && rows * tile_bytes_per_row(config.dtype, d, wide) <= TILE_BUDGET {
            wide
        } else {
            keys
        };
        let mut splits = 1;
        if queries == n_q && tasks < SPLIT_TASKS_PER_CORE * cores {
            let full = n_k / keys;
            let want =
                (SPLIT_TASKS_PER_CORE * cores).div_ceil(tasks).min((n_k / MIN_CHUNK_KEYS).min(full)).max(1);
            // Even chunks, none of them empty.
            splits = full.div_ceil(full.div_ceil(want));
        }
        Blocking { heads_per_task, queries, keys, splits }
    }

    /// Rows of each sub-tile that a causal task's diagonal band runs in, when the band is
    /// split (see [`sdpa_ir`]): `Some` for a causal task of one head's queries taller than one
    /// key block.
    pub fn causal_sub_tile_rows(&self, config: &SdpaConfig) -> Option<usize> {
        let rows = self.heads_per_task * self.queries;
        (config.causal && self.splits == 1 && self.heads_per_task == 1 && rows > CAUSAL_SUB_ROWS)
            .then_some(CAUSAL_SUB_ROWS)
    }

    /// Full key blocks per chunk of a split-K blocking (all full blocks when `splits == 1`).
    pub fn chunk_blocks(&self, n_k: usize) -> usize {
        (n_k / self.keys).div_ceil(self.splits)
    }

    /// THREAD tasks of the kernel for `config`.
    pub fn tasks(&self, config: &SdpaConfig) -> usize {
        let group = config.heads / config.kv_heads;
        config.batch
            * config.kv_heads
            * (group / self.heads_per_task)
            * config.n_q.div_ceil(self.queries)
            * self.splits
    }
}

/// Stack bytes one task row takes with blocks of `keys` keys: the query and output rows, the
/// score row and the running max and sum; 16-bit attention keeps its query row in the input
/// dtype and adds the row of rounded probabilities.
fn tile_bytes_per_row(dtype: SdpaDType, d: usize, keys: usize) -> usize {
    match dtype {
        SdpaDType::F32 => 4 * (2 * d + keys + 2),
        SdpaDType::BF16 | SdpaDType::F16 => 2 * d + 4 * d + 4 * keys + 2 * keys + 8,
    }
}

/// The cores the THREAD range is spread over.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// FlashAttention-2 on tile ops for `config` with block sizes `blocking`.
///
/// Buffers: 0 = q, 1 = k, 2 = v, 3 = output (lengths [`SdpaConfig::q_len`] and
/// [`SdpaConfig::kv_len`], laid out as [`SdpaConfig::layout`], of [`SdpaConfig::dtype`]); then, in this order, the mask
/// or bias (its broadcast shape's element count) and the `batch` i32 key lengths, if any.
/// With `blocking.splits > 1`, slots 3, 4 and 5 are instead the partial states of the tasks
/// for [`super::sdpa_merge_ir`]: output rows (`tasks x rows x D`), running maxima and running
/// sums (`tasks x rows` each), and the mask and key lengths follow from slot 6.
///
/// One THREAD task per (batch item, key/value head, group of query heads, query block): it
/// copies its query rows of `heads_per_task` heads, times `scale * log2(e)`, into a stack tile
/// (so strided q costs nothing later and the softmax works in base 2), then streams the keys of
/// its key/value head in blocks: a tile GEMM for the scores, the mask loop where the block can
/// be partly masked, the online-softmax tile update (one rescale of the output tile per block)
/// and a tile GEMM `O += P · V`. Keys past the last full block go in one narrower block. Under
/// the causal mask, blocks every row sees run unmasked, blocks after the last row's last key
/// are skipped, and only the blocks in between are masked; a task of one head's queries
/// taller than 64 rows runs that diagonal band in sub-tiles of 64 rows, each over the blocks
/// its rows see (so it does the work of 64-row tasks, with the blocks below the band packed
/// once per task). With key lengths, blocks past the item's length are skipped and only the
/// block holding its end is masked. Without a bool mask or bias, the mask loop writes `-inf`
/// over each row's masked suffix of the block only. With a 16-bit dtype the query rows are
/// copied as they are, both GEMMs take 16-bit operands (f32 scores and output tile), and
/// [`TileOp::SoftmaxUpdateRounded`] scales the scores (unless a mask loop that reads every
/// score already did) and writes P, rounded to the dtype, into a tile of its own for `P · V`;
/// the output is rounded once when stored. The last query
/// block starts early enough to be full (it overlaps the previous one) and writes only its own
/// rows. Split-K tasks run the blocks of their key chunk; the last chunk also takes the narrow
/// block.
pub fn sdpa_ir(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, false, false).program()
}

/// [`sdpa_ir`] with the output in the last slot, after the mask or bias and the key lengths
/// (the order of a tensor graph's kernel node: sources, then the output). `blocking.splits`
/// must be 1.
pub(crate) fn sdpa_ir_output_last(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, true, false).program()
}

/// [`sdpa_ir_output_last`] whose output is two consecutive slots: the attention output, then
/// each query row's base-2 log-sum-exp (as [`sdpa_ir_with_lse`] stores it).
pub(crate) fn sdpa_ir_output_last_with_lse(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, true, true).program()
}

/// [`sdpa_ir`] that also stores each query row's base-2 log-sum-exp, what the backward pass
/// recomputes the probabilities from: `lse2 = m + log2(l)` over the row's base-2 scores
/// `scale * log2(e) * q · k` (plus `log2(e) * bias`), with `m` their maximum and `l` the sum
/// of `exp2(score - m)` over the keys the row sees; `-inf` for a row that sees no key.
///
/// The lse buffer comes after every buffer of [`sdpa_ir`]: `batch * heads * n_q` f32s laid
/// out `(batch, head, row)`, whatever the layout of q.
pub fn sdpa_ir_with_lse(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking, false, true).program()
}

struct SdpaKernel {
    c: SdpaConfig,
    b: Blocking,
    rows: usize,
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
    pb: ProgramBuilder,
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
    head0: UOp,
    q0: UOp,
    qblk: UOp,
    qt: UOp,
    si: UOp,
    oi: UOp,
    mi: UOp,
    li: UOp,
    /// The rounded probabilities of 16-bit attention.
    pi: Option<UOp>,
}

impl SdpaKernel {
    fn new(config: &SdpaConfig, blocking: &Blocking, output_last: bool, save_lse: bool) -> Self {
        let c = *config;
        let f32t = DType::F32;
        let el = c.dtype.dtype();
        let rows = blocking.heads_per_task * blocking.queries;
        let q = buffer(0, el, c.q_len());
        let (k, v) = (buffer(1, el, c.kv_len()), buffer(2, el, c.kv_len()));
        let (out, partial, mut slot) = if blocking.splits > 1 {
            let states = blocking.tasks(config) * rows;
            let partial = (buffer(4, f32t, states), buffer(5, f32t, states));
            (buffer(3, f32t, states * c.d), Some(partial), 6)
        } else if output_last {
            let extras = usize::from(c.mask != MaskKind::None) + usize::from(c.key_lengths);
            (buffer(3 + extras, el, c.q_len()), None, 3)
        } else {
            (buffer(3, el, c.q_len()), None, 4)
        };
        let mask = match c.mask {
            MaskKind::None => None,
            MaskKind::Bool(s) => Some((buffer(slot, DType::Bool, s.iter().product()), s)),
            MaskKind::Bias(s) => Some((buffer(slot, f32t, s.iter().product()), s)),
        };
        slot += usize::from(mask.is_some());
        let lens = c.key_lengths.then(|| buffer(slot, DType::I32, c.batch));
        slot += usize::from(lens.is_some());
        // After every other buffer (in the output-last form, right after the output).
        let lse_slot = if output_last { slot + 1 } else { slot };
        let lse = save_lse.then(|| buffer(lse_slot, f32t, c.batch * c.heads * c.n_q));
        let kv_length = c.runtime_kv_length.then(|| var(0, 0, c.n_k as i64));
        SdpaKernel {
            c,
            b: *blocking,
            rows,
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
        let done = if splits == 1 && !bounded {
            let kb = self.pb.range(full, AxisType::Reduce);
            let mut prev = init.clone();
            prev.push(kb.clone());
            let all = self.all_rows();
            let body = self.key_block(&task, &(&kb * bc), bc, &prev, masked_everywhere, all).end(&[kb]);
            if rest > 0 {
                self.key_block(&task, &idx((full * bc) as i64), rest, &[body], masked_everywhere, all)
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
                prev = vec![self.key_block(&task, &start, bc, &after, false, self.all_rows()).end(&[kb])];
            }
            let kd = self.pb.range(&hi - &lo, AxisType::Reduce);
            // The min only tells the verifier's interval bounds that the block stays inside
            // the keys (they do not see that kd < hi - lo).
            let start = min_idx(&((&lo + &kd) * bc), &last_block);
            prev.push(kd.clone());
            let near = self.key_block(&task, &start, bc, &prev, true, self.all_rows()).end(&[kd]);
            if rest == 0 {
                near
            } else if splits == 1 {
                self.key_block(&task, &idx((full * bc) as i64), rest, &[near], true, self.all_rows())
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
                    true,
                    self.all_rows(),
                )
                .end(&[tail])
            }
        };
        self.write(&task, &done)
    }

    /// All rows of the task.
    fn all_rows(&self) -> Span {
        Span { r0: 0, rows: self.rows }
    }

    /// The key loops of a causal task taller than one sub-tile (one query block of one head):
    /// the full blocks every row sees on all rows, unmasked; then per sub-tile of
    /// [`CAUSAL_SUB_ROWS`] rows the further blocks its rows see whole (unmasked) and those
    /// they see in part (masked); last the narrow block of `rest` keys, if any, on all rows.
    fn causal_sub_tiles(&mut self, task: &Task, init: &[UOp], full: usize, rest: usize) -> UOp {
        let bc = self.b.keys;
        let masked_everywhere = self.mask.is_some();
        let last_block = idx(((full.max(1) - 1) * bc) as i64);
        let all = self.all_rows();
        let (clear_all, _) = self.block_bounds(task, full, all);
        let mut prev = init.to_vec();
        if !masked_everywhere {
            let kb = self.pb.range(clear_all.clone(), AxisType::Reduce);
            let mut after = prev.clone();
            after.push(kb.clone());
            prev = vec![self.key_block(task, &(&kb * bc), bc, &after, false, all).end(&[kb])];
        }
        for r0 in (0..self.rows).step_by(CAUSAL_SUB_ROWS) {
            let span = Span { r0, rows: CAUSAL_SUB_ROWS.min(self.rows - r0) };
            let (clear, touched) = self.block_bounds(task, full, span);
            // The sub-tile's rows see at least the blocks every row sees: [clear_all, clear)
            // whole, [clear, touched) in part. The mins only tell the verifier's interval
            // bounds that each block stays inside the keys.
            if !masked_everywhere {
                let ku = self.pb.range(&clear - &clear_all, AxisType::Reduce);
                let start = min_idx(&((&clear_all + &ku) * bc), &last_block);
                let mut after = prev.clone();
                after.push(ku.clone());
                prev = vec![self.key_block(task, &start, bc, &after, false, span).end(&[ku])];
            }
            let lo = if masked_everywhere { clear_all.clone() } else { clear.clone() };
            let kd = self.pb.range(&touched - &lo, AxisType::Reduce);
            let start = min_idx(&((&lo + &kd) * bc), &last_block);
            let mut after = prev.clone();
            after.push(kd.clone());
            prev = vec![self.key_block(task, &start, bc, &after, true, span).end(&[kd])];
        }
        if rest == 0 {
            prev.pop().unwrap_or_else(|| sink(init))
        } else {
            self.key_block(task, &idx((full * bc) as i64), rest, &prev, true, all)
        }
    }

    /// Full key blocks `[0, clear)` that every row of `span` sees whole (no mask needed), and
    /// `touched`: blocks from `touched` on are seen by no row of it (skipped); the blocks
    /// between need the mask. Causal rows and key lengths bound both; a bool mask or bias makes
    /// every block masked.
    fn block_bounds(&self, task: &Task, full: usize, span: Span) -> (UOp, UOp) {
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
    fn causal_offset(&self) -> UOp {
        match &self.kv_length {
            Some(len) => len - self.c.n_q as i64,
            None => idx(self.c.causal_offset()),
        }
    }

    /// The THREAD range, its decomposition and the task's scratch.
    fn task(&mut self) -> Task {
        let SdpaConfig { kv_heads, heads, n_q, n_k, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, keys: bc, splits } = self.b;
        let group = heads / kv_heads;
        let subs = group / gs;
        let blocks = n_q.div_ceil(bq);
        let f32t = DType::F32;
        let pb = &mut self.pb;
        let (qt, s, o, mx, l) = (
            pb.alloc(self.half.unwrap_or(f32t), self.rows * d),
            pb.alloc(f32t, self.rows * bc.min(n_k)),
            pb.alloc(f32t, self.rows * d),
            pb.alloc(f32t, self.rows),
            pb.alloc(f32t, self.rows),
        );
        let p = self.half.map(|el| pb.alloc(el, self.rows * bc.min(n_k)));
        // t = (((item * kv_heads + kv_head) * subs + sub) * blocks + query block) * splits + split
        let t = pb.range(self.c.batch * kv_heads * subs * blocks * splits, AxisType::Thread);
        let split = t.modulo(splits as i64);
        let rows_of = t.idiv(splits as i64);
        let qblk = rows_of.modulo(blocks as i64);
        let rest = rows_of.idiv(blocks as i64);
        let sub = rest.modulo(subs as i64);
        let item_kv = rest.idiv(subs as i64);
        let kv_head = item_kv.modulo(kv_heads as i64);
        let item = item_kv.idiv(kv_heads as i64);
        let [ksb, ksh, _] = self.c.layout.strides(kv_heads, n_k, d);
        let kv_base = &item * ksb + &kv_head * ksh;
        let head0 = &kv_head * group + &sub * gs;
        let q0 = min_idx(&(&qblk * bq), &idx((n_q - bq) as i64));
        let th = std::slice::from_ref(&t);
        Task {
            qt: qt.after(th),
            si: s.after(th),
            oi: o.after(th),
            mi: mx.after(th),
            li: l.after(th),
            pi: p.map(|p| p.after(th)),
            t,
            split,
            item,
            kv_base,
            head0,
            q0,
            qblk,
        }
    }

    /// The scaled copy of the task's queries, the zeroed output tile and the running max and
    /// sum, as effects the key loops come after.
    fn init(&mut self, task: &Task) -> Vec<UOp> {
        let SdpaConfig { heads, n_q, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        let [qsb, qsh, qsn] = self.c.layout.strides(heads, n_q, d);
        let qscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        let pb = &mut self.pb;
        let hh = pb.range(gs, AxisType::Loop);
        let rq = pb.range(bq, AxisType::Loop);
        let e = pb.range(d, AxisType::Loop);
        let src = self.q.index(&task.item * qsb + (&task.head0 + &hh) * qsh + (&task.q0 + &rq) * qsn + &e);
        // A 16-bit query is copied exactly; its scale is applied to the f32 scores instead.
        let value = if self.half.is_some() { src.load() } else { src.load() * qscale };
        let load_q = task.qt.index((&hh * bq + &rq) * d + &e).store(value).end(&[e, rq, hh]);
        let z = pb.range(self.rows * d, AxisType::Loop);
        let init_o = task.oi.index(&z).store(0.0f32).end(&[z]);
        let r = pb.range(self.rows, AxisType::Loop);
        let init_ml =
            sink(&[task.mi.index(&r).store(f32c(f32::NEG_INFINITY)), task.li.index(&r).store(0.0f32)])
                .end(&[r]);
        vec![load_q, init_o, init_ml]
    }

    /// One key block of `cols` keys starting at key `first`, for the rows `span` of the task,
    /// after the effects `prev`: the score GEMM, the mask loop when `masked`, the softmax tile
    /// update and the `P · V` GEMM.
    fn key_block(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        prev: &[UOp],
        masked: bool,
        span: Span,
    ) -> UOp {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let Span { r0, rows } = span;
        let (at_d, at_s) = ((r0 * d) as i64, (r0 * cols) as i64);
        let scores = TileOp::Gemm(GemmShape {
            m: rows,
            n: cols,
            k: d,
            lda: d,
            ldb: ksn,
            ldc: cols,
            a_trans: false,
            b_trans: true,
            accumulate: false,
        });
        let kv_at = &task.kv_base + first * ksn;
        let mut g1 = tile(
            scores,
            &[task.qt.after(prev).index(at_d), self.k.index(&kv_at), task.si.after(prev).index(at_s)],
        );
        // 16-bit attention scales the f32 scores in the softmax step (its query tile is the
        // exact input), except after a mask loop that reads every score: that loop scales
        // them before adding the bias. The suffix form, which writes -inf without reading,
        // leaves the scaling to the softmax step, which keeps -inf only for a positive scale.
        let qscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        let mut softmax_scale = qscale;
        if masked {
            let scaled_by_loop = self.half.is_some() && (self.mask.is_some() || qscale <= 0.0);
            if scaled_by_loop {
                softmax_scale = 1.0;
            }
            g1 = self.mask_block(task, first, cols, g1, span, scaled_by_loop.then_some(qscale));
        }
        let after_g1 = std::slice::from_ref(&g1);
        let mut state = prev.to_vec();
        state.push(g1.clone());
        let mut operands = vec![
            task.si.after(after_g1).index(at_s),
            task.mi.after(&state).index(r0 as i64),
            task.li.after(&state).index(r0 as i64),
            task.oi.after(&state).index(at_d),
        ];
        let update = match &task.pi {
            Some(p) => {
                operands.push(p.after(&state).index(at_s));
                TileOp::SoftmaxUpdateRounded {
                    rows,
                    cols,
                    lds: cols,
                    d,
                    ldo: d,
                    ldp: cols,
                    scale: softmax_scale.to_bits(),
                }
            }
            None => TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d },
        };
        let sm = tile(update, &operands);
        let after_sm = std::slice::from_ref(&sm);
        // P: the rounded tile, or the f32 score tile the f32 step overwrote.
        let probs = task.pi.as_ref().unwrap_or(&task.si);
        let pv = TileOp::Gemm(GemmShape {
            m: rows,
            n: d,
            k: cols,
            lda: cols,
            ldb: ksn,
            ldc: d,
            a_trans: false,
            b_trans: false,
            accumulate: true,
        });
        tile(
            pv,
            &[probs.after(after_sm).index(at_s), self.v.index(&kv_at), task.oi.after(after_sm).index(at_d)],
        )
    }

    /// The loop over a score tile (after `scores`) that adds the bias and sets the keys a row
    /// does not see to `-inf`: causal, past the item's key length, or false in the bool mask.
    /// Only the rows `span` of the tile are touched (all of them with stacked heads). With
    /// `scale`, every score of the rows is multiplied by it first (16-bit attention's unscaled
    /// scores).
    fn mask_block(
        &mut self,
        task: &Task,
        first: &UOp,
        cols: usize,
        scores: UOp,
        span: Span,
        scale: Option<f32>,
    ) -> UOp {
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        // A sub-tile is a span of one head's query rows (heads_per_task is 1 then).
        let (r0, bq) = if span.rows == self.rows { (0, bq) } else { (span.r0, span.rows) };
        if self.mask.is_none() && scale.is_none() {
            return self.mask_suffix(task, first, cols, scores, Span { r0, rows: bq });
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
        let mut keep = Vec::new();
        if self.c.causal {
            keep.push(key.lt(&query + &self.causal_offset() + 1));
        }
        if let Some(len) = &self.kv_length {
            keep.push(key.lt(len));
        }
        if let Some(lens) = &self.lens {
            keep.push(key.lt(lens.index(&task.item).load().cast(DType::INDEX)));
        }
        if let Some((buf, shape)) = &self.mask {
            let [sb, sh, sq, sk] = SdpaConfig::mask_strides(*shape);
            let at = &task.item * sb + (&task.head0 + &hh) * sh + &query * sq + &key * sk;
            let x = buf.index(at).load();
            match self.c.mask {
                MaskKind::Bool(_) => keep.push(x),
                _ => score = score + x * (LOG2E as f32),
            }
        }
        for c in keep {
            score = c.where_(&score, f32c(f32::NEG_INFINITY));
        }
        cell.store(score).end(&[cc, rq, hh])
    }

    /// [`Self::mask_block`] without a bool mask or bias: each row of the tile (rows `r0 .. r0 +
    /// rows` of each stacked head) sees the keys below one bound (its causal limit, the KV
    /// length, the item's key length, whichever is least), so only the row's masked suffix of
    /// the block is touched, set to `-inf` without reading it (a compare and select per
    /// score cost about 4% of a causal run, its diagonal blocks' GEMMs taking little more).
    fn mask_suffix(&mut self, task: &Task, first: &UOp, cols: usize, scores: UOp, span: Span) -> UOp {
        let gs = self.b.heads_per_task;
        let Span { r0, rows } = span;
        let offset = self.c.causal.then(|| self.causal_offset());
        let pb = &mut self.pb;
        let hh = pb.range(gs, AxisType::Loop);
        let rq = pb.range(rows, AxisType::Loop);
        let query = &task.q0 + &rq + r0 as i64;
        let mut bounds = Vec::new();
        if let Some(off) = offset {
            bounds.push(&query + &off + 1);
        }
        if let Some(len) = &self.kv_length {
            bounds.push(len.clone());
        }
        if let Some(lens) = &self.lens {
            bounds.push(lens.index(&task.item).load().cast(DType::INDEX));
        }
        let Some(bound) = bounds.into_iter().reduce(|a, b| min_idx(&a, &b)) else { return scores };
        // The row's first masked column of the block, in 0..=cols.
        let start = min_idx(&(&bound - first).maximum(idx(0)), &idx(cols as i64));
        // Counted down from the last column, so every index is inside the row whatever the
        // suffix's length (the verifier's intervals cannot tie the column to `start`).
        let rc = pb.range(-&start + cols as i64, AxisType::Loop);
        let cell = task
            .si
            .after(&[scores])
            .index((&hh * rows + &rq + r0 as i64) * cols + (-&rc + (cols as i64 - 1)));
        cell.store(f32c(f32::NEG_INFINITY)).end(&[rc, rq, hh])
    }

    /// The division of the task's output rows by their sums (0 for a row that saw no key)
    /// after the key loops `done`, stored into the output; and the program's SINK.
    fn write(&mut self, task: &Task, done: &UOp) -> UOp {
        let SdpaConfig { heads, n_q, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        let [qsb, qsh, qsn] = self.c.layout.strides(heads, n_q, d);
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
        let o = task.oi.after(after).index(&r * d + &e).load();
        let contiguous = self.c.layout.strides(heads, n_q, d) == [heads * n_q * d, n_q * d, d];
        let blocks = n_q.div_ceil(bq);
        let own_rows = contiguous && n_q.is_multiple_of(bq) && (gs == 1 || blocks == 1);
        let at = if own_rows {
            // Task t then owns the `gs * bq` output rows starting at row `t * gs * bq`: the
            // index is written as `t * c + r` with `0 <= r < c`, the form from which the
            // compiler proves that tasks write disjoint memory and runs them in parallel.
            &task.t * (gs * bq * d) + (&hh * bq + &row) * d + &e
        } else {
            &task.item * qsb + (&task.head0 + &hh) * qsh + (&task.q0 + &row) * qsn + &e
        };
        let value = match self.half {
            Some(el) => (o * inv_l).cast(el),
            None => o * inv_l,
        };
        let st = self.out.index(at).store(value);
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
}
