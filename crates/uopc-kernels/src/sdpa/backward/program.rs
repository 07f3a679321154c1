//! The backward loop program: its entry points, the THREAD task, and the loops over key
//! blocks and query blocks.

use super::score_fn::ScoreTiles;
use super::{BackwardBlocking, Geometry};
use crate::LOG2E;
use crate::masked::min_idx;
use crate::sdpa::Blocking;
use crate::sdpa::blocking::cores;
use crate::sdpa::flex::Reads;
use crate::sdpa::kernel::PlanMode;
use crate::sdpa::{AttentionMods, MaskKind, SdpaConfig, SdpaError};
use uopc_ir::{AxisType, DType, ProgramBuilder, TileOp, UOp, buffer, idx, sink, tile};

/// The FlashAttention-2 backward program for `config` with block sizes `blocking`.
///
/// Buffers: 0 = q, 1 = k, 2 = v, 3 = dO (laid out as [`SdpaConfig::layout`]), 4 = the
/// forward's base-2 lse and 5 = `scale * Delta` (each `(batch, head, row)`, `B * H * n_q`),
/// 6 = the dq target (`tasks * group * n_q * D`: task-major, one `(group head, row, d)` block
/// per task, which the task zeroes before accumulating into it), 7 and 8 = the dk and dv targets (task-major, the
/// task's key rows in slot order); then the mask or bias and the key lengths, if any. With
/// one chunk and the BHND layout the three targets are exactly the caller's dq, dk and dv.
/// The bias gets no gradient (see [`sdpa_backward_ir_with_bias_grad`]).
pub fn sdpa_backward_ir(config: &SdpaConfig, blocking: &BackwardBlocking) -> UOp {
    BackwardKernel::new(config, blocking, Outputs::GRADS, None).program()
}

/// [`sdpa_backward_ir`] that also writes the gradient of an additive bias ([`MaskKind::Bias`]),
/// `dS = P * (dP - Delta)` summed over the bias's broadcast axes, into one more buffer after
/// all the others: the dbias target, task-major, one `[heads, rows, keys]` region per task
/// (the group's heads, the query rows and the task's key rows in slot order, each extent 1
/// where the bias broadcasts). Each task zeroes its region and sums its own terms into it, so
/// no element is written by two tasks; tasks that share a bias element (a bias broadcast over
/// batch items or key/value heads, or over keys split into chunks) leave partials for the
/// caller to add. With one chunk and a bias that is full over the tasks' axes the region is
/// exactly the bias's row-major layout.
///
/// # Errors
///
/// [`SdpaError::Extra`] naming `dbias` when `config` has no bias (nothing to differentiate).
pub fn sdpa_backward_ir_with_bias_grad(
    config: &SdpaConfig,
    blocking: &BackwardBlocking,
) -> Result<UOp, SdpaError> {
    if !matches!(config.mask, MaskKind::Bias(_)) {
        return Err(SdpaError::Extra { arg: "dbias", expected: false });
    }
    Ok(BackwardKernel::new(config, blocking, Outputs { grads: true, bias: true, captures: false }, None)
        .program())
}

/// The backward program of a tensor graph's kernel node for `config` (BHND): one chunk, so the
/// targets are exactly dq, dk and dv (each task zeroes its dq rows, as always, which matters
/// here because a node's output buffer holds garbage). Slots as [`sdpa_backward_ir`].
pub(crate) fn sdpa_backward_ir_for_graph(config: &SdpaConfig) -> UOp {
    let kernel = BackwardKernel::new(config, &graph_blocking(config), Outputs::GRADS, None);
    debug_assert!(kernel.g.direct, "one chunk of a BHND configuration writes dq, dk, dv in place");
    kernel.program()
}

/// The one-chunk blocking of the tensor graph's backward kernels.
fn graph_blocking(config: &SdpaConfig) -> BackwardBlocking {
    BackwardBlocking { chunks: 1, ..BackwardBlocking::choose(config, cores()) }
}

/// The bias-gradient program of a tensor graph's kernel node for `config` (BHND, with a bias):
/// S, P, dP and dS recomputed as in [`sdpa_backward_ir_for_graph`], but only dS is kept, into
/// the dbias target of [`sdpa_backward_ir_with_bias_grad`] (slot 9 + 1: after the bias). Its
/// own node, so that a graph whose bias needs no gradient never runs it. Also returns the
/// extents `[tasks, heads, rows, keys]` of that target.
pub(crate) fn sdpa_bias_grad_ir_for_graph(config: &SdpaConfig) -> (UOp, [usize; 4]) {
    let outputs = Outputs { grads: false, bias: true, captures: false };
    let kernel = BackwardKernel::new(config, &graph_blocking(config), outputs, None);
    let [h, r, k] = kernel.g.bias_region.expect("the configuration has a bias");
    let tasks = kernel.g.tasks;
    (kernel.program(), [tasks, h, r, k])
}

/// The forward blocking whose per-run plan counts ([`sdpa_flex_plan_ir`](crate::sdpa::sdpa_flex_plan_ir))
/// the backward of a mask without exact key bounds reads: one head per task and the
/// backward's query and key blocks, so a count is one of its (query block, key block) pairs.
pub(crate) fn plan_blocking(config: &SdpaConfig, blocking: &BackwardBlocking) -> Blocking {
    Blocking {
        heads_per_task: 1,
        queries: blocking.queries,
        keys: blocking.keys,
        splits: 1,
        kv_panel_width: 0,
        ..Blocking::choose(config, cores())
    }
}

/// Which gradients a backward program writes.
#[derive(Clone, Copy)]
pub(super) struct Outputs {
    /// dq, dk and dv.
    pub(super) grads: bool,
    /// The additive bias's.
    pub(super) bias: bool,
    /// The float captures' of attention mods.
    pub(super) captures: bool,
}

impl Outputs {
    pub(super) const GRADS: Outputs = Outputs { grads: true, bias: false, captures: false };
}

pub(super) struct BackwardKernel {
    pub(super) c: SdpaConfig,
    pub(super) b: BackwardBlocking,
    pub(super) g: Geometry,
    pub(super) q: UOp,
    pub(super) k: UOp,
    pub(super) v: UOp,
    pub(super) d_o: UOp,
    pub(super) lse: UOp,
    pub(super) delta: UOp,
    pub(super) dq: UOp,
    pub(super) dk: UOp,
    pub(super) dv: UOp,
    pub(super) mask: Option<(UOp, [usize; 4])>,
    pub(super) lens: Option<UOp>,
    /// The dbias target, when the program writes it.
    pub(super) dbias: Option<UOp>,
    /// Attention mods and their captures' buffers (see [`super::sdpa_flex_backward_ir`]).
    pub(super) mods: Option<(AttentionMods, Vec<UOp>)>,
    /// The per-run counts of a mask without exact key bounds (`units x full key blocks`, f32)
    /// and whether their units are per head (see [`plan_blocking`]).
    pub(super) plan: Option<(UOp, bool)>,
    /// The gradient targets of the float captures (one per capture, `None` for the others),
    /// task-major: one region of the capture's length (the second field) per task.
    pub(super) dcaptures: Vec<Option<(UOp, usize)>>,
    /// The stack tiles the score function's derivative needs, read off it once.
    pub(super) score_tiles: ScoreTiles,
    pub(super) outputs: Outputs,
    pub(super) pb: ProgramBuilder,
    /// The effects (and ranges) the next step comes after.
    pub(super) chain: Vec<UOp>,
}

/// The task's indices and stack tiles.
pub(super) struct Task {
    pub(super) t: UOp,
    pub(super) c: UOp,
    pub(super) item: UOp,
    pub(super) kv_head: UOp,
    pub(super) kv_base: UOp,
    pub(super) kt: UOp,
    pub(super) vt: UOp,
    pub(super) dk_acc: UOp,
    pub(super) dv_acc: UOp,
    pub(super) s: UOp,
    pub(super) dp: UOp,
    /// The scores before the score function (natural units), which the derivatives with
    /// respect to the captures read (only when their gradients are written).
    pub(super) raw: Option<UOp>,
    /// The score function's derivative at each score, when it is not a constant.
    pub(super) slope: Option<UOp>,
}

/// One key block: its first key, its width, and where its rows go in the task's region.
pub(super) struct KeyBlock {
    pub(super) k0: UOp,
    pub(super) cols: usize,
    pub(super) slot_row: UOp,
}

impl BackwardKernel {
    pub(super) fn new(
        config: &SdpaConfig,
        blocking: &BackwardBlocking,
        outputs: Outputs,
        mods: Option<&AttentionMods>,
    ) -> Self {
        let c = *config;
        let g = Geometry::new(&c, blocking);
        let f32t = DType::F32;
        let rows = c.batch * c.heads * c.n_q;
        let mask = match c.mask {
            MaskKind::None => None,
            MaskKind::Bool(s) => Some((buffer(9, DType::Bool, s.iter().product()), s)),
            MaskKind::Bias(s) => Some((buffer(9, f32t, s.iter().product()), s)),
        };
        let lens_slot = if mask.is_some() { 10 } else { 9 };
        let dbias_slot = lens_slot + usize::from(c.key_lengths);
        // Attention mods come without a mask or bias: their captures follow the key lengths,
        // then the float captures' gradient targets.
        let used = mods.map_or(Vec::new(), |m| m.captures_read(Reads::BACKWARD));
        let mods = mods.map(|m| (m.clone(), m.buffers_used(dbias_slot, &used)));
        let mut grad_slot = dbias_slot + used.iter().filter(|&&u| u).count();
        // A mask without exact key bounds: the per-run counts of the pairs each query block
        // sees in each key block (see `plan_blocking`), after the captures.
        let plan = match mods.as_ref().map(|(m, _)| PlanMode::of(m)) {
            Some(mode @ PlanMode::Runtime { per_head }) => {
                let units = mode.units(&c, &plan_blocking(&c, blocking));
                grad_slot += 1;
                Some((buffer(grad_slot - 1, f32t, units * g.full_kb), per_head))
            }
            _ => None,
        };
        let dcaptures = match &mods {
            Some((m, _)) if outputs.captures => m
                .captures()
                .iter()
                .zip(m.captures_with_gradient())
                .map(|(spec, differentiated)| {
                    differentiated.then(|| {
                        grad_slot += 1;
                        (buffer(grad_slot - 1, f32t, g.tasks * spec.len()), spec.len())
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        BackwardKernel {
            score_tiles: mods.as_ref().map_or(ScoreTiles::default(), |(m, _)| ScoreTiles::of(m)),
            mods,
            plan,
            dcaptures,
            dbias: outputs.bias.then(|| buffer(dbias_slot, f32t, g.dbias_len())),
            outputs,
            q: buffer(0, f32t, c.q_len()),
            k: buffer(1, f32t, c.kv_len()),
            v: buffer(2, f32t, c.kv_len()),
            d_o: buffer(3, f32t, c.q_len()),
            lse: buffer(4, f32t, rows),
            delta: buffer(5, f32t, rows),
            dq: buffer(6, f32t, g.dq_len(&c)),
            dk: buffer(7, f32t, g.dkv_len(&c)),
            dv: buffer(8, f32t, g.dkv_len(&c)),
            mask,
            lens: c.key_lengths.then(|| buffer(lens_slot, DType::I32, c.batch)),
            c,
            b: *blocking,
            g,
            pb: ProgramBuilder::new(),
            chain: Vec::new(),
        }
    }

    /// `view` after the chain, indexed at `at`.
    pub(super) fn at(&self, view: &UOp, at: impl Into<UOp>) -> UOp {
        view.after(&self.chain).index(at.into())
    }

    /// Appends a tile op on `operands` (view, first element), after the chain.
    /// The panel width of the task's `K^T` and `V^T` tiles for a key block of `cols` keys: the
    /// f32 GEMM's register-tile width when `cols` is a multiple of it, else `None` (rows).
    pub(super) fn panel_width(&self, cols: usize) -> Option<usize> {
        let w = uopc_tile::panel_width(uopc_tile::Isa::detect());
        cols.is_multiple_of(w).then_some(w)
    }

    pub(super) fn step(&mut self, op: TileOp, operands: &[(&UOp, UOp)]) {
        let src: Vec<UOp> = operands.iter().map(|(v, i)| self.at(v, i.clone())).collect();
        self.chain = vec![tile(op, &src)];
    }

    /// A loop of `end` iterations around what `body` appends to the chain.
    pub(super) fn looped(&mut self, end: UOp, axis: AxisType, body: impl FnOnce(&mut Self, &UOp)) {
        let r = self.pb.range(end, axis);
        self.chain.push(r.clone());
        body(self, &r);
        let effects = std::mem::take(&mut self.chain);
        self.chain = vec![sink(&effects).end(&[r])];
    }

    pub(super) fn program(mut self) -> UOp {
        let task = self.task();
        let bc = self.b.keys;
        let Geometry { full_kb, rest_k, slots, .. } = self.g;
        let chunks = self.b.chunks as i64;
        if full_kb > 0 {
            // Chunk c takes key blocks c, c + chunks, c + 2 chunks, ...: `slots` of them, the
            // last one only where it exists. The trip counts that depend on the chunk (hence
            // on the THREAD index) are only ever guards of 0 or 1 iterations, never part of an
            // index, so the writes stay `t * c + r` and the tasks provably disjoint.
            self.looped(idx(slots as i64), AxisType::Reduce, |me, sb| {
                let kb = &task.c + sb * chunks;
                let live = flag(&(-&kb + full_kb as i64));
                me.looped(live, AxisType::Reduce, |me, _| {
                    // The min only tells the verifier's interval bounds that the block stays
                    // inside the keys (they do not see that kb < full_kb here).
                    let k0 = min_idx(&(&kb * bc), &idx(((full_kb - 1) * bc) as i64));
                    me.key_block(&task, &KeyBlock { k0, cols: bc, slot_row: sb * bc });
                });
            });
        }
        if rest_k > 0 {
            // The narrower last block, taken by chunk 0: one iteration there, none elsewhere.
            let once = flag(&(-&task.c + 1));
            self.looped(once, AxisType::Reduce, |me, _| {
                let k0 = idx((full_kb * bc) as i64);
                me.key_block(&task, &KeyBlock { k0, cols: rest_k, slot_row: idx((slots * bc) as i64) });
            });
        }
        let effects = std::mem::take(&mut self.chain);
        sink(&[sink(&effects).end(&[task.t])])
    }

    /// The THREAD range, its decomposition and the task's stack tiles.
    pub(super) fn task(&mut self) -> Task {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let BackwardBlocking { queries: br, keys: bc, chunks } = self.b;
        let f32t = DType::F32;
        let tiles = self.score_tiles;
        let wants_raw = tiles.raw && self.dcaptures.iter().any(Option::is_some);
        let pb = &mut self.pb;
        let raw = wants_raw.then(|| pb.alloc(DType::F32, br * bc));
        let slope = tiles.slope.then(|| pb.alloc(DType::F32, br * bc));
        let (kt, vt, dk_acc, dv_acc, s, dp) = (
            pb.alloc(f32t, d * bc),
            pb.alloc(f32t, d * bc),
            pb.alloc(f32t, bc * d),
            pb.alloc(f32t, bc * d),
            pb.alloc(f32t, br * bc),
            pb.alloc(f32t, br * bc),
        );
        // t = (item * kv_heads + kv_head) * chunks + c
        let t = pb.range(self.g.tasks, AxisType::Thread);
        let c = t.modulo(chunks as i64);
        let pair = t.idiv(chunks as i64);
        let kv_head = pair.modulo(kv_heads as i64);
        let item = pair.idiv(kv_heads as i64);
        let [ksb, ksh, _] = self.c.layout.strides(kv_heads, n_k, d);
        let kv_base = &item * ksb + &kv_head * ksh;
        let th = std::slice::from_ref(&t);
        self.chain = vec![t.clone()];
        if self.outputs.grads {
            // The task's dq rows are `t * c + r`: every query row of its group's heads. Zeroed
            // here, in parallel, rather than by the caller, so no target needs clearing.
            let per_task = self.g.group * self.c.n_q * d;
            let z = self.pb.range(per_task, AxisType::Loop);
            // After the THREAD range, so that it stays inside it even when there is one task
            // (whose index then folds to a constant).
            let zero = self.dq.after(th).index(&t * per_task + &z).store(0.0f32).end(&[z]);
            self.chain.push(zero);
        }
        if let Some(dbias) = &self.dbias {
            // The terms are summed into the region (broadcast axes, and key blocks that no
            // query row sees leave elements untouched), so it starts at zero.
            let per_task = self.g.bias_task_len();
            let z = self.pb.range(per_task, AxisType::Loop);
            let zero = dbias.after(th).index(&t * per_task + &z).store(0.0f32).end(&[z]);
            self.chain.push(zero);
        }
        for (dcap, per_task) in self.dcaptures.iter().flatten() {
            // Summed into, like dbias: each task's region starts at zero.
            let per_task = *per_task;
            let z = self.pb.range(per_task, AxisType::Loop);
            let zero = dcap.after(th).index(&t * per_task + &z).store(0.0f32).end(&[z]);
            self.chain.push(zero);
        }
        Task {
            raw: raw.map(|r| r.after(th)),
            slope: slope.map(|r| r.after(th)),
            kt: kt.after(th),
            vt: vt.after(th),
            dk_acc: dk_acc.after(th),
            dv_acc: dv_acc.after(th),
            s: s.after(th),
            dp: dp.after(th),
            t,
            c,
            item,
            kv_head,
            kv_base,
        }
    }

    /// One key block: the scaled transposed copies of K and V, zeroed accumulators, every
    /// query block of every head of the group that can see it, and the dK and dV rows.
    pub(super) fn key_block(&mut self, task: &Task, kb: &KeyBlock) {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let cols = kb.cols;
        let kscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        let vscale = self.c.effective_scale();
        // K^T and V^T (d x cols), which the score and dP GEMMs read as B for every query block:
        // in the panels the micro-kernel reads in place when the block is a whole number of
        // them (no per-GEMM packing), else untransposed rows. `(j, e)` is the block's key and
        // head dimension, `to` where the pair lands in the tiles.
        let (j, e, to, ranges) = match self.panel_width(cols) {
            Some(w) => {
                let (jp, jj, e) = (
                    self.pb.range(cols / w, AxisType::Loop),
                    self.pb.range(w, AxisType::Loop),
                    self.pb.range(d, AxisType::Loop),
                );
                let to = &jp * (d * w) + &e * w + &jj;
                (&jp * w + &jj, e.clone(), to, vec![e, jj, jp])
            }
            None => {
                let (j, e) = (self.pb.range(cols, AxisType::Loop), self.pb.range(d, AxisType::Loop));
                (j.clone(), e.clone(), &e * cols + &j, vec![e, j])
            }
        };
        let src = &task.kv_base + (&kb.k0 + &j) * ksn + &e;
        let copy = sink(&[
            self.at(&task.kt, to.clone()).store(self.k.index(src.clone()).load() * kscale),
            self.at(&task.vt, to).store(self.v.index(src).load() * vscale),
        ])
        .end(&ranges);
        if !self.outputs.grads {
            self.chain = vec![copy];
            let group = self.g.group;
            self.looped(idx(group as i64), AxisType::Reduce, |me, hh| me.query_blocks(task, kb, hh));
            return;
        }
        let z = self.pb.range(cols * d, AxisType::Loop);
        let zero = sink(&[
            self.at(&task.dk_acc, z.clone()).store(0.0f32),
            self.at(&task.dv_acc, z.clone()).store(0.0f32),
        ])
        .end(&[z]);
        self.chain = vec![copy, zero];

        let group = self.g.group;
        self.looped(idx(group as i64), AxisType::Reduce, |me, hh| me.query_blocks(task, kb, hh));

        // dK (scale already in dS) and dV of the block's rows, into the task's region.
        let (j, e) = (self.pb.range(cols, AxisType::Loop), self.pb.range(d, AxisType::Loop));
        let out = &task.t * (self.g.task_rows * d) + (&kb.slot_row + &j) * d + &e;
        let acc = &j * d + &e;
        let write = sink(&[
            self.dk.index(out.clone()).store(self.at(&task.dk_acc, acc.clone()).load()),
            self.dv.index(out).store(self.at(&task.dv_acc, acc).load()),
        ])
        .end(&[e, j]);
        self.chain = vec![write];
    }

    /// The query blocks of head `hh` of the group against key block `kb`: under the causal
    /// mask, blocks that see none of the keys are skipped and only those the diagonal crosses
    /// are masked; the narrower last block is always masked when there is any mask.
    pub(super) fn query_blocks(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp) {
        let br = self.b.queries as i64;
        let Geometry { full_qb, rest_q, .. } = self.g;
        if self.mods.as_ref().is_some_and(|(m, _)| m.has_mask()) {
            self.flex_query_blocks(task, kb, hh);
            return;
        }
        let general = self.mask.is_some() || self.lens.is_some();
        if full_qb > 0 {
            // Every full query block in a loop of constant length, so the dq index depends on
            // no THREAD-dependent trip count; under the causal mask the blocks are sorted by
            // 0/1-iteration guards into skipped, diagonal (masked) and below (unmasked).
            self.looped(idx(full_qb as i64), AxisType::Reduce, |me, qb| {
                let q0 = qb * br;
                if !me.c.causal {
                    me.pair(task, kb, hh, &q0, br as usize, general);
                    return;
                }
                let off = me.c.causal_offset();
                // Row i sees key j iff j <= i + off: rows from k0 - off on see the first key,
                // rows from k0 + cols - 1 - off on see them all.
                let touched = (&kb.k0 - off).maximum(idx(0)).idiv(br);
                let clear = ((&kb.k0 + (kb.cols as i64 - 1 - off)).maximum(idx(0)) + (br - 1)).idiv(br);
                let diagonal = min_idx(&flag(&(qb - &touched + 1)), &flag(&(&clear - qb)));
                me.looped(diagonal, AxisType::Reduce, |me, _| me.pair(task, kb, hh, &q0, br as usize, true));
                let below = flag(&(qb - &clear + 1));
                me.looped(below, AxisType::Reduce, |me, _| me.pair(task, kb, hh, &q0, br as usize, general));
            });
        }
        if rest_q > 0 {
            let q0 = idx(full_qb as i64 * br);
            self.pair(task, kb, hh, &q0, rest_q, general || self.c.causal);
        }
    }
}

/// 1 when `x > 0`, else 0: the trip count of a guard loop.
pub(super) fn flag(x: &UOp) -> UOp {
    min_idx(&x.maximum(idx(0)), &idx(1))
}
