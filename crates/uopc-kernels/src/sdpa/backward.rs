//! The FlashAttention-2 backward pass of [`super`] on tile ops: [`SdpaBackward`].
//!
//! Notation per head: base-2 scores `s2 = scale * log2(e) * q k^T (+ log2(e) * bias)`, masked
//! entries `-inf`; the forward saved `lse2_i = log2(sum_j 2^(s2_ij))`, so `P = exp2(s2 - lse2)`.
//! With `dO` the gradient at the output, `dP = dO V^T`, `Delta_i = dO_i · O_i`,
//! `dS = P * (dP - Delta)` (the gradient at the scaled scores), and
//! `dV = P^T dO`, `dK = scale * dS^T Q`, `dQ = scale * dS K`. The scale is folded in once:
//! the task's copy of `V^T` and `Delta` are multiplied by it, so `dP` and `dS` come out scaled
//! and the dK and dQ GEMMs need no further pass. An additive bias's gradient is `dS` itself
//! (summed over the bias's broadcast axes); a second program writes it when asked for
//! ([`sdpa_backward_ir_with_bias_grad`]), so the plain backward never pays for its writes.
//!
//! **Work split.** One THREAD task per (batch item, key/value head, chunk). A task loops over
//! its key blocks; for each it copies `K^T` (times `scale * log2(e)`) and `V^T` (times `scale`)
//! to the stack once and then visits every query head of the group and every query block that
//! can see the block, so dK and dV of the block are summed on the stack without races (GQA
//! included) and written once. **dQ** is accumulated in place by the same tasks: a task owns
//! every query row of its group's heads, so `dQ += dS K` needs no second pass over the query
//! blocks (which would recompute S, P, dP and dS: 7 GEMMs per block pair instead of 5). When
//! there are fewer (item, head) pairs than cores, each head's key blocks are dealt round-robin
//! to `chunks` tasks (round-robin balances the causal mask, where early key blocks are seen
//! by more queries); each chunk then accumulates its own dQ partial, and the host adds the
//! `chunks` partials (a temporary of `chunks` times dQ, which only small problems get).
//!
//! **No N x N buffer**: the score and gradient tiles are `queries x keys` on the stack; the
//! temporaries are `Delta` (`B * H * n_q`), and, when the program cannot write the caller's
//! buffers in place (chunks > 1, or the BNHD layout), the chunked dQ partials and a task-major
//! copy of dK and dV, all O(N * D).

use super::kernel::{Blocking, cores, sdpa_ir_with_lse};
use super::{ConfigCache, Extras, Layout, MaskKind, SdpaConfig, SdpaError, cached, check, push_extras};
use crate::masked::min_idx;
use crate::online::LOG2E;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use uopc_ir::{AxisType, DType, GemmShape, ProgramBuilder, TileOp, UOp, buffer, f32c, idx, sink, tile};
use uopc_jit::{Arg, JitError, MAX_LOCAL_BYTES, Program};

/// Block sizes and work split of one compiled backward pass (see [`BackwardBlocking::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardBlocking {
    /// Query rows per block.
    pub queries: usize,
    /// Keys per block.
    pub keys: usize,
    /// Tasks sharing the key blocks of one (batch item, key/value head), round-robin.
    pub chunks: usize,
}

/// Stack the task's tiles may take: the JIT's limit less room for the kernel's own frame.
const TILE_BUDGET: usize = MAX_LOCAL_BYTES - 16 * 1024;

impl BackwardBlocking {
    /// Block sizes for `config` on `cores` cores.
    ///
    /// A task's stack holds `K^T`, `V^T` and the dK and dV accumulators (`keys x D` each) and
    /// the score and gradient tiles (`queries x keys` each); they must fit the JIT's stack
    /// limit less 16 KiB. Keys are 64 (32 at D > 128, where four 64-key panels would not fit):
    /// a 64-key block fills the micro-kernel's 32-wide panels twice and keeps the per-block
    /// copies of K and V small next to the work they serve. Query rows are 64, fewer when the
    /// stack is short. Chunks split the key blocks of a head when there are fewer (item, head)
    /// pairs than cores.
    pub fn choose(config: &SdpaConfig, cores: usize) -> BackwardBlocking {
        let &SdpaConfig { batch, kv_heads, n_q, n_k, d, .. } = config;
        let fits = |br: usize, bc: usize| 4 * (4 * bc * d + 2 * br * bc) <= TILE_BUDGET;
        let mut keys = if d > 128 { 32 } else { 64 }.min(n_k);
        while keys > 1 && !fits(1, keys) {
            keys /= 2;
        }
        let mut queries = 64.min(n_q);
        while queries > 1 && !fits(queries, keys) {
            queries /= 2;
        }
        let heads = batch * kv_heads;
        let full = n_k / keys;
        let chunks = if heads >= cores { 1 } else { cores.div_ceil(heads).min(full).max(1) };
        BackwardBlocking { queries, keys, chunks }
    }

    fn valid(&self, c: &SdpaConfig) -> bool {
        let fits = 4 * (4 * self.keys * c.d + 2 * self.queries * self.keys) <= TILE_BUDGET;
        (1..=c.n_q).contains(&self.queries) && (1..=c.n_k).contains(&self.keys) && self.chunks >= 1 && fits
    }
}

/// The sizes the backward program and its host steps agree on.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    group: usize,
    tasks: usize,
    /// Full key blocks, and the keys of the narrower last block (0: none).
    full_kb: usize,
    rest_k: usize,
    /// Full query blocks, and the rows of the narrower last block (0: none).
    full_qb: usize,
    rest_q: usize,
    /// Key-block slots per chunk (the most full blocks one chunk gets).
    slots: usize,
    /// Key rows of one task's region of the dK / dV target.
    task_rows: usize,
    /// Whether the program writes the caller's dq, dk and dv in place.
    direct: bool,
    /// With an additive bias: the extents `[heads, rows, keys]` of one task's region of the
    /// dbias target, each 1 where the bias broadcasts (the task sums its terms there).
    bias_region: Option<[usize; 3]>,
    /// Whether that target is exactly the caller's dbias (no two tasks share an element).
    bias_direct: bool,
}

impl Geometry {
    fn new(c: &SdpaConfig, b: &BackwardBlocking) -> Geometry {
        let full_kb = c.n_k / b.keys;
        let slots = full_kb.div_ceil(b.chunks);
        let rest_k = c.n_k % b.keys;
        Geometry {
            group: c.heads / c.kv_heads,
            tasks: c.batch * c.kv_heads * b.chunks,
            full_kb,
            rest_k,
            full_qb: c.n_q / b.queries,
            rest_q: c.n_q % b.queries,
            slots,
            task_rows: slots * b.keys + rest_k,
            direct: b.chunks == 1 && c.layout == Layout::Bhnd,
            bias_region: match c.mask {
                MaskKind::Bias(shape) => Some([
                    if shape[1] != 1 { c.heads / c.kv_heads } else { 1 },
                    if shape[2] != 1 { c.n_q } else { 1 },
                    if shape[3] != 1 { slots * b.keys + rest_k } else { 1 },
                ]),
                _ => None,
            },
            // Tasks differ in (item, key/value head, chunk): they share a bias element only
            // where the bias broadcasts over an axis that tells them apart.
            bias_direct: match c.mask {
                MaskKind::Bias(shape) => {
                    b.chunks == 1 && (c.batch == 1 || shape[0] != 1) && (c.kv_heads == 1 || shape[1] != 1)
                }
                _ => false,
            },
        }
    }

    /// Elements of one task's region of the dbias target (0 without a bias).
    fn bias_task_len(&self) -> usize {
        self.bias_region.map_or(0, |r| r.iter().product())
    }

    /// Elements of the dbias target: one region per task.
    fn dbias_len(&self) -> usize {
        self.tasks * self.bias_task_len()
    }

    /// The key of row `slot` of chunk `chunk`'s region (slot order, as dk and dv), if that
    /// slot holds a key block of the chunk.
    fn slot_key(&self, b: &BackwardBlocking, chunk: usize, slot: usize) -> Option<usize> {
        let (sb, j) = (slot / b.keys, slot % b.keys);
        if sb < self.slots {
            let kb = chunk + sb * b.chunks;
            (kb < self.full_kb).then_some(kb * b.keys + j)
        } else {
            (chunk == 0 && j < self.rest_k).then_some(self.full_kb * b.keys + j)
        }
    }

    /// Elements of the dq target (the caller's dq when direct: `chunks == 1`).
    fn dq_len(&self, c: &SdpaConfig) -> usize {
        self.tasks * self.group * c.n_q * c.d
    }

    /// Elements of each of the dk and dv targets.
    fn dkv_len(&self, c: &SdpaConfig) -> usize {
        self.tasks * self.task_rows * c.d
    }
}

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
    BackwardKernel::new(config, blocking, Outputs::GRADS).program()
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
    Ok(BackwardKernel::new(config, blocking, Outputs { grads: true, bias: true }).program())
}

/// The backward program of a tensor graph's kernel node for `config` (BHND): one chunk, so the
/// targets are exactly dq, dk and dv (each task zeroes its dq rows, as always, which matters
/// here because a node's output buffer holds garbage). Slots as [`sdpa_backward_ir`].
pub(crate) fn sdpa_backward_ir_for_graph(config: &SdpaConfig) -> UOp {
    let kernel = BackwardKernel::new(config, &graph_blocking(config), Outputs::GRADS);
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
    let kernel = BackwardKernel::new(config, &graph_blocking(config), Outputs { grads: false, bias: true });
    let [h, r, k] = kernel.g.bias_region.expect("the configuration has a bias");
    let tasks = kernel.g.tasks;
    (kernel.program(), [tasks, h, r, k])
}

/// Which gradients a backward program writes.
#[derive(Clone, Copy)]
struct Outputs {
    /// dq, dk and dv.
    grads: bool,
    /// The additive bias's.
    bias: bool,
}

impl Outputs {
    const GRADS: Outputs = Outputs { grads: true, bias: false };
}

struct BackwardKernel {
    c: SdpaConfig,
    b: BackwardBlocking,
    g: Geometry,
    q: UOp,
    k: UOp,
    v: UOp,
    d_o: UOp,
    lse: UOp,
    delta: UOp,
    dq: UOp,
    dk: UOp,
    dv: UOp,
    mask: Option<(UOp, [usize; 4])>,
    lens: Option<UOp>,
    /// The dbias target, when the program writes it.
    dbias: Option<UOp>,
    outputs: Outputs,
    pb: ProgramBuilder,
    /// The effects (and ranges) the next step comes after.
    chain: Vec<UOp>,
}

/// The task's indices and stack tiles.
struct Task {
    t: UOp,
    c: UOp,
    item: UOp,
    kv_head: UOp,
    kv_base: UOp,
    kt: UOp,
    vt: UOp,
    dk_acc: UOp,
    dv_acc: UOp,
    s: UOp,
    dp: UOp,
}

/// One key block: its first key, its width, and where its rows go in the task's region.
struct KeyBlock {
    k0: UOp,
    cols: usize,
    slot_row: UOp,
}

impl BackwardKernel {
    fn new(config: &SdpaConfig, blocking: &BackwardBlocking, outputs: Outputs) -> Self {
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
        BackwardKernel {
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
    fn at(&self, view: &UOp, at: impl Into<UOp>) -> UOp {
        view.after(&self.chain).index(at.into())
    }

    /// Appends a tile op on `operands` (view, first element), after the chain.
    fn step(&mut self, op: TileOp, operands: &[(&UOp, UOp)]) {
        let src: Vec<UOp> = operands.iter().map(|(v, i)| self.at(v, i.clone())).collect();
        self.chain = vec![tile(op, &src)];
    }

    /// A loop of `end` iterations around what `body` appends to the chain.
    fn looped(&mut self, end: UOp, axis: AxisType, body: impl FnOnce(&mut Self, &UOp)) {
        let r = self.pb.range(end, axis);
        self.chain.push(r.clone());
        body(self, &r);
        let effects = std::mem::take(&mut self.chain);
        self.chain = vec![sink(&effects).end(&[r])];
    }

    fn program(mut self) -> UOp {
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
    fn task(&mut self) -> Task {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let BackwardBlocking { queries: br, keys: bc, chunks } = self.b;
        let f32t = DType::F32;
        let pb = &mut self.pb;
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
        Task {
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
    fn key_block(&mut self, task: &Task, kb: &KeyBlock) {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let cols = kb.cols;
        let kscale = (f64::from(self.c.effective_scale()) * LOG2E) as f32;
        let vscale = self.c.effective_scale();
        // K^T and V^T (d x cols): the score and dP GEMMs then read B untransposed, in place.
        let (j, e) = (self.pb.range(cols, AxisType::Loop), self.pb.range(d, AxisType::Loop));
        let src = &task.kv_base + (&kb.k0 + &j) * ksn + &e;
        let to = &e * cols + &j;
        let copy = sink(&[
            self.at(&task.kt, to.clone()).store(self.k.index(src.clone()).load() * kscale),
            self.at(&task.vt, to).store(self.v.index(src).load() * vscale),
        ])
        .end(&[e, j]);
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
    fn query_blocks(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp) {
        let br = self.b.queries as i64;
        let Geometry { full_qb, rest_q, .. } = self.g;
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

    /// One (query block, key block) pair: S, the mask, P, dP, dS, and the three accumulations.
    fn pair(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp, q0: &UOp, rows: usize, masked: bool) {
        let SdpaConfig { heads, n_q, d, kv_heads, n_k, .. } = self.c;
        let [qsb, qsh, qsn] = self.c.layout.strides(heads, n_q, d);
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let cols = kb.cols;
        let head = &task.kv_head * self.g.group + hh;
        let q_at = &task.item * qsb + &head * qsh + q0 * qsn;
        let row_at = (&task.item * heads + &head) * n_q + q0;
        let gemm = |m, n, k, lda, ldb, ldc, a_trans, accumulate| {
            TileOp::Gemm(GemmShape { m, n, k, lda, ldb, ldc, a_trans, b_trans: false, accumulate })
        };
        let (s, dp, q, d_o) = (task.s.clone(), task.dp.clone(), self.q.clone(), self.d_o.clone());
        // S = Q (K scale log2 e)^T, base-2 scores.
        self.step(
            gemm(rows, cols, d, qsn, cols, cols, false, false),
            &[(&q, q_at.clone()), (&task.kt, idx(0)), (&s, idx(0))],
        );
        if masked {
            self.mask_tile(task, kb, &head, q0, rows);
        }
        let lse = self.lse.clone();
        self.step(TileOp::SoftmaxRecompute { rows, cols, ld: cols }, &[(&s, idx(0)), (&lse, row_at.clone())]);
        // dP = dO (V scale)^T.
        self.step(
            gemm(rows, cols, d, qsn, cols, cols, false, false),
            &[(&d_o, q_at.clone()), (&task.vt, idx(0)), (&dp, idx(0))],
        );
        let delta = self.delta.clone();
        self.step(
            TileOp::SoftmaxGrad { rows, cols, ld: cols },
            &[(&s, idx(0)), (&dp, idx(0)), (&delta, row_at)],
        );
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
    fn bias_grad_tile(&mut self, task: &Task, kb: &KeyBlock, hh: &UOp, q0: &UOp, rows: usize) {
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

    /// The loop over the score tile that adds the bias and sets the keys a row does not see
    /// to `-inf` (causal, past the item's key length, false in the bool mask).
    fn mask_tile(&mut self, task: &Task, kb: &KeyBlock, head: &UOp, q0: &UOp, rows: usize) {
        let cols = kb.cols;
        let rq = self.pb.range(rows, AxisType::Loop);
        let cc = self.pb.range(cols, AxisType::Loop);
        let cell = self.at(&task.s, &rq * cols + &cc);
        let key = &kb.k0 + &cc;
        let query = q0 + &rq;
        let mut score = cell.load();
        let mut keep = Vec::new();
        if self.c.causal {
            keep.push(key.lt(&query + (self.c.causal_offset() + 1)));
        }
        if let Some(lens) = &self.lens {
            keep.push(key.lt(lens.index(&task.item).load().cast(DType::INDEX)));
        }
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

/// 1 when `x > 0`, else 0: the trip count of a guard loop.
fn flag(x: &UOp) -> UOp {
    min_idx(&x.maximum(idx(0)), &idx(1))
}

/// What the forward pass keeps for the backward: its inputs, its output and the per-row lse.
#[derive(Clone, Copy, Debug)]
pub struct ForwardSaved<'a> {
    /// q, as given to the forward.
    pub q: &'a [f32],
    /// k.
    pub k: &'a [f32],
    /// v.
    pub v: &'a [f32],
    /// The forward's output.
    pub o: &'a [f32],
    /// The forward's base-2 log-sum-exp, `(batch, head, row)` ([`SdpaBackward::lse_len`]).
    pub lse: &'a [f32],
}

/// A compiled forward-with-lse and FlashAttention-2 backward for one [`SdpaConfig`]; `Sync`,
/// so one compile serves every thread. The pair a vector-Jacobian product needs: run
/// [`SdpaBackward::forward`] (which keeps the lse), then [`SdpaBackward::run`] with the
/// output's gradient.
#[derive(Debug)]
pub struct SdpaBackward {
    config: SdpaConfig,
    forward_blocking: Blocking,
    blocking: BackwardBlocking,
    forward: Program,
    program: Program,
    /// The backward that also writes dbias ([`sdpa_backward_ir_with_bias_grad`]), compiled on
    /// the first [`SdpaBackward::run_with_bias_grad`], so that a bias without a gradient costs
    /// neither its compile nor its writes.
    bias_grad: OnceLock<Program>,
    /// The dq partials and task-major dk and dv of chunked or BHND-strided runs, reused.
    scratch: Mutex<Vec<f32>>,
}

impl SdpaBackward {
    /// Validates `config`, chooses block sizes for this machine and compiles both programs.
    /// At `UOPC_DEBUG` level 1 or more it prints its choice (the [`Display`](fmt::Display)
    /// line) and the compile time to stderr.
    pub fn compile(config: &SdpaConfig) -> Result<SdpaBackward, SdpaError> {
        config.validate()?;
        let cores = cores();
        // The forward runs unsplit: split-K tasks write partial states, not the rows' lse.
        let forward = Blocking { splits: 1, ..Blocking::choose(config, cores) };
        Self::compile_with(config, forward, BackwardBlocking::choose(config, cores))
    }

    /// [`SdpaBackward::compile`] with the given block sizes (for experiments and tests).
    pub fn compile_with(
        config: &SdpaConfig,
        forward: Blocking,
        blocking: BackwardBlocking,
    ) -> Result<SdpaBackward, SdpaError> {
        config.validate()?;
        let fwd_valid = forward.heads_per_task >= 1
            && (config.heads / config.kv_heads).is_multiple_of(forward.heads_per_task)
            && (1..=config.n_q).contains(&forward.queries)
            && (1..=config.n_k).contains(&forward.keys)
            && forward.splits == 1;
        if config.runtime_kv_length {
            return Err(JitError::Unsupported(
                "sdpa backward: a runtime KV length (decode) has no backward; use a fixed n_k".into(),
            )
            .into());
        }
        if config.dtype != super::SdpaDType::F32 {
            return Err(JitError::Unsupported(format!(
                "sdpa backward: SdpaBackward takes f32 configurations, and this one's dtype is {}; \
                 SdpaBackwardHalf is the backward of 16-bit attention",
                config.dtype
            ))
            .into());
        }
        if !fwd_valid || !blocking.valid(config) {
            return Err(JitError::Unsupported(format!(
                "sdpa backward: blocking {forward:?} / {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        let fwd = Program::compile(&sdpa_ir_with_lse(config, &forward), "sdpa_forward_lse")?;
        let program = Program::compile(&sdpa_backward_ir(config, &blocking), "sdpa_backward_tile_ops")?;
        let b = SdpaBackward {
            config: *config,
            forward_blocking: forward,
            blocking,
            forward: fwd,
            program,
            bias_grad: OnceLock::new(),
            scratch: Mutex::new(Vec::new()),
        };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!(
                "{b}; compiled in {:.1} ms",
                (b.forward.compile_seconds() + b.program.compile_seconds()) * 1e3
            );
        }
        Ok(b)
    }

    /// Elements of the lse buffer: `batch * heads * n_q`.
    pub fn lse_len(&self) -> usize {
        self.config.batch * self.config.heads * self.config.n_q
    }

    /// The attention forward (as [`super::Sdpa::run`]) that also stores each query row's
    /// base-2 log-sum-exp into `lse` ([`SdpaBackward::lse_len`] elements, `(batch, head, row)`;
    /// see [`super::sdpa_ir_with_lse`]), which [`SdpaBackward::run`] needs.
    pub fn forward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        extras: Extras<'_>,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        check("q", c.q_len(), q.len())?;
        check("k", c.kv_len(), k.len())?;
        check("v", c.kv_len(), v.len())?;
        check("out", c.q_len(), out.len())?;
        check("lse", self.lse_len(), lse.len())?;
        let mut args: Vec<Arg<'_>> = vec![q.into(), k.into(), v.into(), Arg::WriteF32(out)];
        push_extras(c, extras, &mut args)?;
        args.push(Arg::WriteF32(lse));
        self.forward.run(&mut args)?;
        Ok(())
    }

    /// The gradients of the attention at `saved` (what [`SdpaBackward::forward`] read and
    /// produced) for the output gradient `d_o`, into `dq` (q's length) and `dk`, `dv` (k's).
    /// `extras` must be the forward's. Every length is checked, each error naming its
    /// argument. Rows that saw no key get zero gradients. The bias gets no gradient (see
    /// [`SdpaBackward::run_with_bias_grad`]).
    pub fn run(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) -> Result<(), SdpaError> {
        self.run_inner(saved, d_o, extras, [dq, dk, dv], None)
    }

    /// [`SdpaBackward::run`] into `[dq, dk, dv]` that also writes the gradient of the
    /// additive bias into `dbias` (the bias's shape and length): `dS = P * (dP - Delta)`
    /// summed over the axes the bias broadcasts along, zero where no row sees the key. The
    /// first call compiles the program that writes it (then kept in `self`), so a bias
    /// without a gradient costs nothing.
    ///
    /// # Errors
    ///
    /// As [`SdpaBackward::run`]; [`SdpaError::Extra`] naming `dbias` when the configuration has
    /// no bias, [`SdpaError::Length`] naming it when its length is not the bias's.
    pub fn run_with_bias_grad(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        [dq, dk, dv]: [&mut [f32]; 3],
        dbias: &mut [f32],
    ) -> Result<(), SdpaError> {
        let MaskKind::Bias(shape) = self.config.mask else {
            return Err(SdpaError::Extra { arg: "dbias", expected: false });
        };
        check("dbias", shape.iter().product(), dbias.len())?;
        self.run_inner(saved, d_o, extras, [dq, dk, dv], Some(dbias))
    }

    /// The compiled backward that also writes dbias, compiled on first use.
    fn bias_grad_program(&self) -> Result<&Program, SdpaError> {
        if let Some(p) = self.bias_grad.get() {
            return Ok(p);
        }
        let ir = sdpa_backward_ir_with_bias_grad(&self.config, &self.blocking)?;
        let program = Program::compile(&ir, "sdpa_backward_bias_grad_tile_ops")?;
        // A racing compile is harmless: the first one stored is used.
        Ok(self.bias_grad.get_or_init(|| program))
    }

    fn run_inner(
        &self,
        saved: ForwardSaved<'_>,
        d_o: &[f32],
        extras: Extras<'_>,
        [dq, dk, dv]: [&mut [f32]; 3],
        dbias: Option<&mut [f32]>,
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        check("q", c.q_len(), saved.q.len())?;
        check("k", c.kv_len(), saved.k.len())?;
        check("v", c.kv_len(), saved.v.len())?;
        check("o", c.q_len(), saved.o.len())?;
        check("lse", self.lse_len(), saved.lse.len())?;
        check("d_o", c.q_len(), d_o.len())?;
        check("dq", c.q_len(), dq.len())?;
        check("dk", c.kv_len(), dk.len())?;
        check("dv", c.kv_len(), dv.len())?;
        let g = Geometry::new(c, &self.blocking);
        let delta = self.delta(saved.o, d_o);
        let mut extra_args = Vec::new();
        push_extras(c, extras, &mut extra_args)?;
        let program = if dbias.is_some() { self.bias_grad_program()? } else { &self.program };
        // The dbias target: the caller's dbias when no two tasks share an element, else the
        // tasks' partials, added into dbias after the kernel.
        let mut dbias_partials = match &dbias {
            Some(_) if !g.bias_direct => vec![0.0f32; g.dbias_len()],
            _ => Vec::new(),
        };
        let (dbias_direct, dbias_sum) = match dbias {
            Some(out) if g.bias_direct => (Some(out), None),
            other => (None, other),
        };
        if let Some(target) = dbias_direct {
            extra_args.push(Arg::WriteF32(target));
        } else if dbias_sum.is_some() {
            extra_args.push(Arg::WriteF32(&mut dbias_partials));
        }
        let run = |dq_t: &mut [f32], dk_t: &mut [f32], dv_t: &mut [f32], extra: Vec<Arg<'_>>| {
            let mut args: Vec<Arg<'_>> = vec![
                saved.q.into(),
                saved.k.into(),
                saved.v.into(),
                d_o.into(),
                saved.lse.into(),
                delta.as_slice().into(),
                Arg::WriteF32(dq_t),
                Arg::WriteF32(dk_t),
                Arg::WriteF32(dv_t),
            ];
            args.extend(extra);
            program.run(&mut args)
        };
        if g.direct {
            run(dq, dk, dv, extra_args)?;
        } else {
            // The chunks' targets, kept between runs: each task zeroes its dq rows and writes
            // all of its dk and dv rows, so nothing needs clearing here, and a fresh (zeroed,
            // page-faulted) allocation per run is avoided. A run that finds the buffer taken
            // by a concurrent run allocates its own.
            let mut scratch = std::mem::take(&mut *self.scratch.lock().unwrap_or_else(|e| e.into_inner()));
            let (dq_len, dkv_len) = (g.dq_len(c), g.dkv_len(c));
            scratch.resize(dq_len + 2 * dkv_len, 0.0);
            let (dq_t, dkv_t) = scratch.split_at_mut(dq_len);
            let (dk_t, dv_t) = dkv_t.split_at_mut(dkv_len);
            run(dq_t, dk_t, dv_t, extra_args)?;
            self.gather(&g, [dq_t, dk_t, dv_t], [dq, dk, dv]);
            *self.scratch.lock().unwrap_or_else(|e| e.into_inner()) = scratch;
        }
        if let Some(out) = dbias_sum {
            self.sum_bias_partials(&g, &dbias_partials, out);
        }
        Ok(())
    }

    /// Adds the tasks' dbias regions (see [`sdpa_backward_ir_with_bias_grad`]) into `dbias`,
    /// each element to the bias element it stands for.
    fn sum_bias_partials(&self, g: &Geometry, partials: &[f32], dbias: &mut [f32]) {
        let c = &self.config;
        let (MaskKind::Bias(shape), Some([heads, rows, keys])) = (c.mask, g.bias_region) else { return };
        let [sb, sh, sq, sk] = SdpaConfig::mask_strides(shape);
        let chunks = self.blocking.chunks;
        dbias.fill(0.0);
        let mut regions = partials.chunks_exact(g.bias_task_len());
        for item in 0..c.batch {
            for kvh in 0..c.kv_heads {
                for ch in 0..chunks {
                    let region = regions.next().expect("one region per task");
                    for hh in 0..heads {
                        for i in 0..rows {
                            let base = item * sb + (kvh * g.group + hh) * sh + i * sq;
                            let from = &region[(hh * rows + i) * keys..][..keys];
                            if keys == 1 {
                                dbias[base] += from[0];
                                continue;
                            }
                            for (slot, &x) in from.iter().enumerate() {
                                if let Some(key) = g.slot_key(&self.blocking, ch, slot) {
                                    dbias[base + key * sk] += x;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// `scale * Delta`, with `Delta_i = dO_i · O_i` per row, `(batch, head, row)`.
    fn delta(&self, o: &[f32], d_o: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let [sb, sh, sn] = c.layout.strides(c.heads, c.n_q, c.d);
        let scale = c.effective_scale();
        let mut delta = Vec::with_capacity(self.lse_len());
        for b in 0..c.batch {
            for h in 0..c.heads {
                for i in 0..c.n_q {
                    let at = b * sb + h * sh + i * sn;
                    delta.push(scale * dot(&o[at..at + c.d], &d_o[at..at + c.d]));
                }
            }
        }
        delta
    }

    /// Sums the dq partials of the chunks into `dq` and scatters the task-major dk and dv
    /// into the caller's layout.
    fn gather(&self, g: &Geometry, [dq_t, dk_t, dv_t]: [&[f32]; 3], [dq, dk, dv]: [&mut [f32]; 3]) {
        let c = &self.config;
        let d = c.d;
        let chunks = self.blocking.chunks;
        let bc = self.blocking.keys;
        let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, d);
        let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, d);
        let per_task_q = g.group * c.n_q * d;
        for item in 0..c.batch {
            for kvh in 0..c.kv_heads {
                let t0 = (item * c.kv_heads + kvh) * chunks;
                for hh in 0..g.group {
                    for i in 0..c.n_q {
                        let to = item * qsb + (kvh * g.group + hh) * qsh + i * qsn;
                        let row = &mut dq[to..to + d];
                        row.fill(0.0);
                        for ch in 0..chunks {
                            let from = (t0 + ch) * per_task_q + (hh * c.n_q + i) * d;
                            for (x, &y) in row.iter_mut().zip(&dq_t[from..from + d]) {
                                *x += y;
                            }
                        }
                    }
                }
                for ch in 0..chunks {
                    let task_base = (t0 + ch) * g.task_rows * d;
                    let mut copy = |slot_row: usize, key: usize| {
                        let from = task_base + slot_row * d;
                        let to = item * ksb + kvh * ksh + key * ksn;
                        dk[to..to + d].copy_from_slice(&dk_t[from..from + d]);
                        dv[to..to + d].copy_from_slice(&dv_t[from..from + d]);
                    };
                    let mut sb = 0;
                    while ch + sb * chunks < g.full_kb {
                        for j in 0..bc {
                            copy(sb * bc + j, (ch + sb * chunks) * bc + j);
                        }
                        sb += 1;
                    }
                    if ch == 0 {
                        for j in 0..g.rest_k {
                            copy(g.slots * bc + j, g.full_kb * bc + j);
                        }
                    }
                }
            }
        }
    }

    /// Bytes of the buffers one [`SdpaBackward::run`] allocates besides its arguments: Delta,
    /// and the chunked dq partials and task-major dk and dv when not written in place.
    pub fn temporary_bytes(&self) -> usize {
        let c = &self.config;
        let g = Geometry::new(c, &self.blocking);
        let delta = self.lse_len();
        let targets = if g.direct { 0 } else { g.dq_len(c) + 2 * g.dkv_len(c) };
        4 * (delta + targets)
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The backward's block sizes.
    pub fn blocking(&self) -> BackwardBlocking {
        self.blocking
    }

    /// The forward-with-lse's block sizes.
    pub fn forward_blocking(&self) -> Blocking {
        self.forward_blocking
    }

    /// The compiled forward-with-lse.
    pub fn forward_program(&self) -> &Program {
        &self.forward
    }

    /// The compiled backward kernel (loop IR, estimates, compile time).
    pub fn program(&self) -> &Program {
        &self.program
    }
}

impl fmt::Display for SdpaBackward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let b = &self.blocking;
        write!(
            f,
            "sdpa backward flash_tile_ops: B={} H={} H_kv={} n_q={} n_k={} D={}{}; key blocks of {} in {} chunk(s) per head, query blocks of {}, dQ accumulated in place{}",
            c.batch,
            c.heads,
            c.kv_heads,
            c.n_q,
            c.n_k,
            c.d,
            if c.causal { " causal" } else { "" },
            b.keys,
            b.chunks,
            b.queries,
            if b.chunks > 1 { " per chunk, partials summed" } else { "" }
        )
    }
}

/// Dot product with eight independent partial sums (vectorizable).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xs.remainder().iter().zip(ys.remainder()).map(|(a, b)| a * b).sum();
    for (xa, ya) in xs.zip(ys) {
        for ((s, &a), &b) in acc.iter_mut().zip(xa).zip(ya) {
            *s += a * b;
        }
    }
    acc.iter().sum::<f32>() + tail
}

static CACHE: ConfigCache<SdpaBackward> = OnceLock::new();

/// The compiled backward (with its forward-with-lse) for `config`, compiled on first use and
/// shared by every later call in the process, like [`super::compiled`].
pub fn compiled_backward(config: &SdpaConfig) -> Result<Arc<SdpaBackward>, SdpaError> {
    Ok(cached(&CACHE, config, SdpaBackward::compile)?.0)
}
