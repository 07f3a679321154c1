//! Scaled dot-product attention for the shapes models run, through one entry point:
//! [`Sdpa::compile`] for a [`SdpaConfig`], then [`Sdpa::run`] any number of times from any
//! thread, or [`attention`], which compiles each configuration once per process.
//!
//! q is `(B, H, n_q, D)`, k and v are `(B, H_kv, n_k, D)` with `H % H_kv == 0`: query head `h`
//! reads key/value head `h / (H / H_kv)` (multi-head, grouped-query and multi-query attention
//! by index arithmetic, never by copying K or V). The output has q's shape and layout.
//!
//! **Causal convention**: queries are aligned to the end of the keys, so query `i` sees keys
//! `j <= i + n_k - n_q` (the KV-cache convention; with `n_q = n_k` this is `j <= i`). A query
//! row that sees no key at all (under any combination of masks) gives zeros, never NaN. A NaN in
//! a key or value that a row sees makes that row NaN, as in an exact softmax.
//!
//! The kernel is FlashAttention-2 on tile ops (see [`sdpa_ir`]).

use crate::masked::min_idx;
use crate::online::LOG2E;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use thiserror::Error;
use uopc_ir::{AxisType, DType, GemmShape, ProgramBuilder, TileOp, UOp, buffer, f32c, idx, sink, tile};
use uopc_jit::{Arg, BufRef, JitError, MAX_LOCAL_BYTES, Program};

/// How q, k, v and the output are laid out in memory; the head dimension is always contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// `(batch, head, row, d)`, contiguous.
    #[default]
    Bhnd,
    /// `(batch, row, head, d)`, contiguous: what splitting a fused QKV projection's output by
    /// heads gives, read in place (the row stride is `heads * d`).
    Bnhd,
}

impl Layout {
    /// Element strides `[batch, head, row]` of a tensor with `heads` heads of `rows` rows of `d`.
    pub fn strides(self, heads: usize, rows: usize, d: usize) -> [usize; 3] {
        match self {
            Layout::Bhnd => [heads * rows * d, rows * d, d],
            Layout::Bnhd => [rows * heads * d, d, heads * d],
        }
    }
}

/// An optional mask over `(B, H, n_q, n_k)`, given with its own shape: each of the four
/// dimensions is either the full size or 1 (broadcast along that axis).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MaskKind {
    /// No mask.
    #[default]
    None,
    /// A bool mask of this shape, row-major; `true` = attend.
    Bool([usize; 4]),
    /// An additive f32 bias of this shape, row-major, added to the scaled scores (ALiBi,
    /// relative positions); `-inf` masks a key.
    Bias([usize; 4]),
}

/// Everything that selects a compiled attention program.
#[derive(Clone, Copy, Debug, Default)]
pub struct SdpaConfig {
    /// Batch items.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; must divide `heads`.
    pub kv_heads: usize,
    /// Query rows per head.
    pub n_q: usize,
    /// Key (and value) rows per head.
    pub n_k: usize,
    /// Head dimension.
    pub d: usize,
    /// The causal mask, aligned to the end of the keys (see the module docs).
    pub causal: bool,
    /// Score scale; `None` is `1 / sqrt(d)`.
    pub scale: Option<f32>,
    /// Memory layout of q, k, v and the output.
    pub layout: Layout,
    /// The mask or bias, if any.
    pub mask: MaskKind,
    /// Whether `run` takes per-batch key lengths: item `b` attends keys `j < len[b]` only.
    pub key_lengths: bool,
}

impl SdpaConfig {
    /// A multi-head configuration without masks: `heads` query and key/value heads, BHND.
    pub fn new(batch: usize, heads: usize, n_q: usize, n_k: usize, d: usize) -> Self {
        SdpaConfig { batch, heads, kv_heads: heads, n_q, n_k, d, ..SdpaConfig::default() }
    }

    /// The scale actually applied to `q · k`.
    pub fn effective_scale(&self) -> f32 {
        self.scale.unwrap_or((1.0 / (self.d as f64).sqrt()) as f32)
    }

    /// Elements of q (and of the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.n_q * self.d
    }

    /// Elements of k (and of v).
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.n_k * self.d
    }

    /// How far keys run ahead of queries under the causal mask: query `i` sees `j <= i + offset`.
    pub fn causal_offset(&self) -> i64 {
        self.n_k as i64 - self.n_q as i64
    }

    /// The full extents `(B, H, n_q, n_k)` a mask broadcasts against.
    fn mask_dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_q, self.n_k]
    }

    /// Row-major element strides of a mask of `shape`, 0 on broadcast axes.
    fn mask_strides(shape: [usize; 4]) -> [usize; 4] {
        let mut strides = [0; 4];
        let mut acc = 1;
        for a in (0..4).rev() {
            strides[a] = if shape[a] == 1 { 0 } else { acc };
            acc *= shape[a];
        }
        strides
    }

    /// The configuration's own consistency: sizes, head grouping, mask shape.
    pub fn validate(&self) -> Result<(), SdpaError> {
        for (what, v) in [
            ("batch", self.batch),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("n_q", self.n_q),
            ("n_k", self.n_k),
            ("d", self.d),
        ] {
            if v == 0 {
                return Err(SdpaError::Empty { what });
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(SdpaError::HeadGrouping { heads: self.heads, kv_heads: self.kv_heads });
        }
        if let MaskKind::Bool(shape) | MaskKind::Bias(shape) = self.mask {
            let full = self.mask_dims();
            for axis in 0..4 {
                if shape[axis] != 1 && shape[axis] != full[axis] {
                    return Err(SdpaError::MaskShape { axis, got: shape[axis], full: full[axis] });
                }
            }
        }
        if let Some(s) = self.scale
            && !s.is_finite()
        {
            return Err(SdpaError::Scale(s));
        }
        Ok(())
    }

    /// The fields as a hashable key (the scale by its bits).
    fn key(&self) -> impl std::hash::Hash + Eq + use<> {
        let s = *self;
        (
            [s.batch, s.heads, s.kv_heads, s.n_q, s.n_k, s.d],
            (s.causal, s.key_lengths),
            s.scale.map(f32::to_bits),
            s.layout,
            s.mask,
        )
    }
}

/// What is wrong with a configuration or with the arguments of a run; each names the argument.
#[derive(Debug, Error)]
pub enum SdpaError {
    /// A size is zero.
    #[error("sdpa: `{what}` must be positive")]
    Empty {
        /// The field.
        what: &'static str,
    },
    /// `heads` is not a multiple of `kv_heads`.
    #[error("sdpa: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")]
    HeadGrouping {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// A mask dimension is neither 1 nor the full size.
    #[error("sdpa: mask dimension {axis} of (B, H, n_q, n_k) is {got}; it must be 1 or {full}")]
    MaskShape {
        /// Axis 0..4 of `(B, H, n_q, n_k)`.
        axis: usize,
        /// The given size.
        got: usize,
        /// The full size.
        full: usize,
    },
    /// The scale is NaN or infinite.
    #[error("sdpa: scale {0} is not finite")]
    Scale(f32),
    /// A slice has the wrong length.
    #[error("sdpa: `{arg}` has {got} elements; the configuration needs {expected}")]
    Length {
        /// The argument.
        arg: &'static str,
        /// Its required length.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// An extra argument is missing or was given although the configuration has no use for it.
    #[error("sdpa: `{arg}` {}", if *.expected { "is required by the configuration" } else { "was given but the configuration has none" })]
    Extra {
        /// The argument.
        arg: &'static str,
        /// Whether the configuration needs it.
        expected: bool,
    },
    /// A key length is negative or above `n_k`.
    #[error("sdpa: key_lengths[{item}] = {len} is outside 0..={n_k}")]
    KeyLength {
        /// Batch item.
        item: usize,
        /// Its length.
        len: i32,
        /// Keys per head.
        n_k: usize,
    },
    /// The JIT refused the program.
    #[error("sdpa: {0}")]
    Jit(#[from] JitError),
}

/// The optional inputs of [`Sdpa::run`]; which ones must be given follows the configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// The bool mask, for [`MaskKind::Bool`].
    pub mask: Option<&'a [bool]>,
    /// The additive bias, for [`MaskKind::Bias`].
    pub bias: Option<&'a [f32]>,
    /// `batch` key lengths, when [`SdpaConfig::key_lengths`] is set.
    pub key_lengths: Option<&'a [i32]>,
}

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
}

/// Keys per block: a 64-key block of K and V (32 KiB each at D = 128) stays in L1/L2 while both
/// GEMMs of the block read it, and 64 columns fill the score micro-kernel's 4 x 16-lane rows.
const KEY_BLOCK: usize = 64;

/// Rows per task under the causal mask: twice the key block, so the masked half of the
/// diagonal band stays small next to the work (at n = 1024 the static FLOPs are 0.56 of the
/// unmasked kernel's instead of 0.63 with 256 rows).
const CAUSAL_MAX_ROWS: usize = 2 * KEY_BLOCK;

/// Stack the tiles of one task may take: the JIT's limit less room for the kernel's own frame.
const TILE_BUDGET: usize = MAX_LOCAL_BYTES - 16 * 1024;

impl Blocking {
    /// Block sizes for `config` on `cores` cores.
    ///
    /// The task's tiles (scaled Q and output, `rows x D` each, the `rows x keys` score tile,
    /// and the running max and sum) must fit the JIT's stack limit less 16 KiB; within that,
    /// rows are as many as possible, up to 256 (a multiple of 16), because every task re-packs
    /// each K/V block it reads and taller tiles amortize that; under the causal mask at most
    /// 128, since the masked half of each diagonal band grows with the rows. With fewer
    /// queries than rows, the query heads of a key/value group fill the rows (decode: one K/V pass serves the whole group). Query
    /// blocks are then evened out (no mostly-empty last block), and split further if there
    /// would be fewer tasks than cores.
    pub fn choose(config: &SdpaConfig, cores: usize) -> Blocking {
        let &SdpaConfig { batch, heads, kv_heads, n_q, n_k, d, .. } = config;
        let keys = KEY_BLOCK.min(n_k);
        let per_row = 4 * (2 * d + keys + 2);
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
        let mut blocks = n_q.div_ceil(queries);
        let tasks = batch * kv_heads * (group / heads_per_task) * blocks;
        if tasks < cores {
            blocks = (blocks * cores.div_ceil(tasks)).min(n_q);
        }
        queries = n_q.div_ceil(blocks);
        Blocking { heads_per_task, queries, keys }
    }
}

/// The cores the THREAD range is spread over.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// FlashAttention-2 on tile ops for `config` with block sizes `blocking`.
///
/// Buffers: 0 = q, 1 = k, 2 = v, 3 = output (lengths [`SdpaConfig::q_len`] and
/// [`SdpaConfig::kv_len`], laid out as [`SdpaConfig::layout`]); then, in this order, the mask
/// or bias (its broadcast shape's element count) and the `batch` i32 key lengths, if any.
///
/// One THREAD task per (batch item, key/value head, group of query heads, query block): it
/// copies its query rows of `heads_per_task` heads, times `scale * log2(e)`, into a stack tile
/// (so strided q costs nothing later and the softmax works in base 2), then streams the keys of
/// its key/value head in blocks: a tile GEMM for the scores, the mask loop where the block can
/// be partly masked, the online-softmax tile update (one rescale of the output tile per block)
/// and a tile GEMM `O += P · V`. Keys past the last full block go in one narrower block. Under
/// the causal mask, blocks every row sees run unmasked, blocks after the last row's last key
/// are skipped, and only the blocks in between are masked. The last query block starts early
/// enough to be full (it overlaps the previous one) and writes only its own rows.
pub fn sdpa_ir(config: &SdpaConfig, blocking: &Blocking) -> UOp {
    SdpaKernel::new(config, blocking).program()
}

struct SdpaKernel {
    c: SdpaConfig,
    b: Blocking,
    rows: usize,
    q: UOp,
    k: UOp,
    v: UOp,
    out: UOp,
    mask: Option<(UOp, [usize; 4])>,
    lens: Option<UOp>,
    pb: ProgramBuilder,
}

/// The THREAD task's indices and scratch views, shared by the parts of the program.
struct Task {
    t: UOp,
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
}

impl SdpaKernel {
    fn new(config: &SdpaConfig, blocking: &Blocking) -> Self {
        let c = *config;
        let f32t = DType::F32;
        let (q, out) = (buffer(0, f32t, c.q_len()), buffer(3, f32t, c.q_len()));
        let (k, v) = (buffer(1, f32t, c.kv_len()), buffer(2, f32t, c.kv_len()));
        let mask = match c.mask {
            MaskKind::None => None,
            MaskKind::Bool(s) => Some((buffer(4, DType::Bool, s.iter().product()), s)),
            MaskKind::Bias(s) => Some((buffer(4, f32t, s.iter().product()), s)),
        };
        let lens_slot = if mask.is_some() { 5 } else { 4 };
        let lens = c.key_lengths.then(|| buffer(lens_slot, DType::I32, c.batch));
        let rows = blocking.heads_per_task * blocking.queries;
        SdpaKernel { c, b: *blocking, rows, q, k, v, out, mask, lens, pb: ProgramBuilder::new() }
    }

    fn program(mut self) -> UOp {
        let task = self.task();
        let init = self.init(&task);
        let Blocking { keys: bc, .. } = self.b;
        let n_k = self.c.n_k;
        let (full, rest) = (n_k / bc, n_k % bc);
        let general = self.mask.is_some() || self.lens.is_some();
        let done = if self.c.causal {
            let off = self.c.causal_offset();
            let bq = self.b.queries as i64;
            // Keys every row of the block sees: j <= q0 + off; keys the last row sees: j < q0 + bq + off.
            let seen_by_all = (&task.q0 + (off + 1)).maximum(idx(0));
            let seen_by_last = (&task.q0 + (bq + off)).maximum(idx(0));
            let clear = min_idx(&seen_by_all.idiv(bc as i64), &idx(full as i64));
            let touched = min_idx(&(seen_by_last + (bc as i64 - 1)).idiv(bc as i64), &idx(full as i64));
            let kb = self.pb.range(&clear, AxisType::Reduce);
            let mut prev = init.clone();
            prev.push(kb.clone());
            let far = self.key_block(&task, &(&kb * bc), bc, &prev, general).end(&[kb]);
            let kd = self.pb.range(&touched - &clear, AxisType::Reduce);
            // The min only tells the verifier's interval bounds that the block stays inside
            // the keys (they do not see that kd < touched - clear).
            let first = min_idx(&((&clear + &kd) * bc), &idx(((full - 1) * bc) as i64));
            let near = self.key_block(&task, &first, bc, &[far, kd.clone()], true).end(&[kd]);
            if rest > 0 { self.key_block(&task, &idx((full * bc) as i64), rest, &[near], true) } else { near }
        } else {
            let kb = self.pb.range(full, AxisType::Reduce);
            let mut prev = init.clone();
            prev.push(kb.clone());
            let body = self.key_block(&task, &(&kb * bc), bc, &prev, general).end(&[kb]);
            if rest > 0 {
                self.key_block(&task, &idx((full * bc) as i64), rest, &[body], general)
            } else {
                body
            }
        };
        self.write(&task, &done)
    }

    /// The THREAD range, its decomposition and the task's scratch.
    fn task(&mut self) -> Task {
        let SdpaConfig { kv_heads, heads, n_q, n_k, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, keys: bc } = self.b;
        let group = heads / kv_heads;
        let subs = group / gs;
        let blocks = n_q.div_ceil(bq);
        let f32t = DType::F32;
        let pb = &mut self.pb;
        let (qt, s, o, mx, l) = (
            pb.alloc(f32t, self.rows * d),
            pb.alloc(f32t, self.rows * bc.min(n_k)),
            pb.alloc(f32t, self.rows * d),
            pb.alloc(f32t, self.rows),
            pb.alloc(f32t, self.rows),
        );
        // t = ((item * kv_heads + kv_head) * subs + sub) * blocks + query block
        let t = pb.range(self.c.batch * kv_heads * subs * blocks, AxisType::Thread);
        let qblk = t.modulo(blocks as i64);
        let rest = t.idiv(blocks as i64);
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
            t,
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
        let load_q = task.qt.index((&hh * bq + &rq) * d + &e).store(src.load() * qscale).end(&[e, rq, hh]);
        let z = pb.range(self.rows * d, AxisType::Loop);
        let init_o = task.oi.index(&z).store(0.0f32).end(&[z]);
        let r = pb.range(self.rows, AxisType::Loop);
        let init_ml =
            sink(&[task.mi.index(&r).store(f32c(f32::NEG_INFINITY)), task.li.index(&r).store(0.0f32)])
                .end(&[r]);
        vec![load_q, init_o, init_ml]
    }

    /// One key block of `cols` keys starting at key `first`, after the effects `prev`: the
    /// score GEMM, the mask loop when `masked`, the softmax tile update and the `P · V` GEMM.
    fn key_block(&mut self, task: &Task, first: &UOp, cols: usize, prev: &[UOp], masked: bool) -> UOp {
        let SdpaConfig { kv_heads, n_k, d, .. } = self.c;
        let [_, _, ksn] = self.c.layout.strides(kv_heads, n_k, d);
        let rows = self.rows;
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
        let mut g1 =
            tile(scores, &[task.qt.after(prev).index(0), self.k.index(&kv_at), task.si.after(prev).index(0)]);
        if masked {
            g1 = self.mask_block(task, first, cols, g1);
        }
        let after_g1 = std::slice::from_ref(&g1);
        let mut state = prev.to_vec();
        state.push(g1.clone());
        let update = TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d };
        let sm = tile(
            update,
            &[
                task.si.after(after_g1).index(0),
                task.mi.after(&state).index(0),
                task.li.after(&state).index(0),
                task.oi.after(&state).index(0),
            ],
        );
        let after_sm = std::slice::from_ref(&sm);
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
        tile(pv, &[task.si.after(after_sm).index(0), self.v.index(&kv_at), task.oi.after(after_sm).index(0)])
    }

    /// The loop over a score tile (after `scores`) that adds the bias and sets the keys a row
    /// does not see to `-inf`: causal, past the item's key length, or false in the bool mask.
    fn mask_block(&mut self, task: &Task, first: &UOp, cols: usize, scores: UOp) -> UOp {
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        let pb = &mut self.pb;
        let hh = pb.range(gs, AxisType::Loop);
        let rq = pb.range(bq, AxisType::Loop);
        let cc = pb.range(cols, AxisType::Loop);
        let cell = task.si.after(&[scores]).index((&hh * bq + &rq) * cols + &cc);
        let key = first + &cc;
        let query = &task.q0 + &rq;
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

    /// The division of the task's output rows by their sums (0 for a row that saw no key)
    /// after the key loops `done`, stored into the output; and the program's SINK.
    fn write(&mut self, task: &Task, done: &UOp) -> UOp {
        let SdpaConfig { heads, n_q, d, .. } = self.c;
        let Blocking { heads_per_task: gs, queries: bq, .. } = self.b;
        let [qsb, qsh, qsn] = self.c.layout.strides(heads, n_q, d);
        let after = std::slice::from_ref(done);
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
        let at = &task.item * qsb + (&task.head0 + &hh) * qsh + (&task.q0 + &row) * qsn + &e;
        let st = self.out.index(at).store(o * inv_l);
        sink(&[st.end(&[e, rq, hh, task.t.clone()])])
    }
}

/// A compiled attention for one [`SdpaConfig`]; `Sync`, so one compile serves every thread.
#[derive(Debug)]
pub struct Sdpa {
    config: SdpaConfig,
    blocking: Blocking,
    program: Program,
}

impl Sdpa {
    /// Validates `config`, chooses block sizes for this machine and compiles the kernel. At
    /// `UOPC_DEBUG` level 1 or more it prints its choice (the [`Display`](fmt::Display) line)
    /// and the compile time to stderr.
    pub fn compile(config: &SdpaConfig) -> Result<Sdpa, SdpaError> {
        Self::compile_with(config, Blocking::choose(config, cores()))
    }

    /// [`Sdpa::compile`] with the given block sizes (for experiments and tests; the library's
    /// own choice is [`Blocking::choose`]).
    pub fn compile_with(config: &SdpaConfig, blocking: Blocking) -> Result<Sdpa, SdpaError> {
        config.validate()?;
        let valid = blocking.heads_per_task >= 1
            && (config.heads / config.kv_heads).is_multiple_of(blocking.heads_per_task)
            && (1..=config.n_q).contains(&blocking.queries)
            && (1..=config.n_k).contains(&blocking.keys);
        if !valid {
            return Err(JitError::Unsupported(format!(
                "sdpa: blocking {blocking:?} does not fit {config:?}"
            ))
            .into());
        }
        let program = Program::compile(&sdpa_ir(config, &blocking), "sdpa_flash_tile_ops")?;
        let sdpa = Sdpa { config: *config, blocking, program };
        if uopc_tensor::debug_level() >= 1 {
            eprintln!("{sdpa}; compiled in {:.1} ms", sdpa.program.compile_seconds() * 1e3);
        }
        Ok(sdpa)
    }

    /// `out = softmax(scale * q k^T + bias, masked) v`, into the caller's `out` (q's length).
    /// Every length is checked, and `extras` must hold exactly what the configuration needs.
    pub fn run(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        extras: Extras<'_>,
        out: &mut [f32],
    ) -> Result<(), SdpaError> {
        let c = &self.config;
        let check = |arg, expected, got| {
            if expected == got { Ok(()) } else { Err(SdpaError::Length { arg, expected, got }) }
        };
        check("q", c.q_len(), q.len())?;
        check("k", c.kv_len(), k.len())?;
        check("v", c.kv_len(), v.len())?;
        check("out", c.q_len(), out.len())?;
        let mut args: Vec<Arg<'_>> = vec![q.into(), k.into(), v.into(), Arg::WriteF32(out)];
        let extra = |arg, expected: bool, given: bool| {
            if expected == given { Ok(()) } else { Err(SdpaError::Extra { arg, expected }) }
        };
        extra("mask", matches!(c.mask, MaskKind::Bool(_)), extras.mask.is_some())?;
        extra("bias", matches!(c.mask, MaskKind::Bias(_)), extras.bias.is_some())?;
        extra("key_lengths", c.key_lengths, extras.key_lengths.is_some())?;
        let mask_len = match c.mask {
            MaskKind::Bool(s) | MaskKind::Bias(s) => s.iter().product(),
            MaskKind::None => 0,
        };
        if let Some(m) = extras.mask {
            check("mask", mask_len, m.len())?;
            args.push(Arg::Read(BufRef::Bool(m)));
        }
        if let Some(b) = extras.bias {
            check("bias", mask_len, b.len())?;
            args.push(Arg::Read(BufRef::F32(b)));
        }
        if let Some(lens) = extras.key_lengths {
            check("key_lengths", c.batch, lens.len())?;
            if let Some((item, &len)) =
                lens.iter().enumerate().find(|(_, l)| !(0..=c.n_k as i64).contains(&i64::from(**l)))
            {
                return Err(SdpaError::KeyLength { item, len, n_k: c.n_k });
            }
            args.push(Arg::Read(BufRef::I32(lens)));
        }
        self.program.run(&mut args)?;
        Ok(())
    }

    /// The configuration it was compiled for.
    pub fn config(&self) -> &SdpaConfig {
        &self.config
    }

    /// The block sizes it uses.
    pub fn blocking(&self) -> Blocking {
        self.blocking
    }

    /// The compiled kernel (loop IR, estimates, compile time).
    pub fn program(&self) -> &Program {
        &self.program
    }
}

impl fmt::Display for Sdpa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let b = &self.blocking;
        write!(
            f,
            "sdpa flash_tile_ops: B={} H={} H_kv={} n_q={} n_k={} D={}{}; tasks of {} head(s) x {} queries, keys in blocks of {}",
            c.batch,
            c.heads,
            c.kv_heads,
            c.n_q,
            c.n_k,
            c.d,
            if c.causal { " causal" } else { "" },
            b.heads_per_task,
            b.queries,
            b.keys
        )
    }
}

/// The process-wide cache's key: a configuration compared by value, the scale by its bits.
#[derive(Clone, Copy)]
struct Key(SdpaConfig);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}
impl Eq for Key {}
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

type Cache = Mutex<HashMap<Key, Arc<Sdpa>>>;

static CACHE: OnceLock<Cache> = OnceLock::new();
static COMPILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The compiled attention for `config`, compiled on first use and shared by every later call
/// in the process (configurations are few, so the cache is not bounded).
pub fn compiled(config: &SdpaConfig) -> Result<Arc<Sdpa>, SdpaError> {
    let cache = CACHE.get_or_init(Default::default);
    let key = Key(*config);
    if let Some(hit) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Arc::clone(hit));
    }
    // Compile outside the lock, so other configurations are not held up; a racing compile of
    // the same configuration is harmless, the first one stored wins.
    let fresh = Arc::new(Sdpa::compile(config)?);
    COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Arc::clone(map.entry(key).or_insert(fresh)))
}

/// How many programs [`compiled`] (and so [`attention`]) has compiled in this process.
pub fn compile_count() -> usize {
    COMPILES.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`Sdpa::run`] of the cached compile of `config` (see [`compiled`]).
pub fn attention(
    config: &SdpaConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    extras: Extras<'_>,
    out: &mut [f32],
) -> Result<(), SdpaError> {
    compiled(config)?.run(q, k, v, extras, out)
}

/// Attention in f64 for `config` (same masks, layout and conventions as [`Sdpa::run`]), the
/// reference the kernel is checked against: per query row, the scores of the keys it sees
/// (a `-inf` score counts as unseen), max-subtracted exponentials, the weighted sum of values.
/// `extras` must match the configuration (unchecked beyond slice indexing).
pub fn reference_f64(config: &SdpaConfig, q: &[f32], k: &[f32], v: &[f32], extras: Extras<'_>) -> Vec<f64> {
    let c = config;
    let group = c.heads / c.kv_heads;
    let scale = f64::from(c.effective_scale());
    let [qsb, qsh, qsn] = c.layout.strides(c.heads, c.n_q, c.d);
    let [ksb, ksh, ksn] = c.layout.strides(c.kv_heads, c.n_k, c.d);
    let mstr = match c.mask {
        MaskKind::Bool(s) | MaskKind::Bias(s) => SdpaConfig::mask_strides(s),
        MaskKind::None => [0; 4],
    };
    let mut out = vec![0.0f64; c.q_len()];
    let mut scores: Vec<(usize, f64)> = Vec::with_capacity(c.n_k);
    for b in 0..c.batch {
        let len = extras.key_lengths.map_or(c.n_k, |l| l[b].max(0) as usize);
        for h in 0..c.heads {
            let hk = h / group;
            for i in 0..c.n_q {
                let qi = &q[b * qsb + h * qsh + i * qsn..][..c.d];
                scores.clear();
                for j in 0..c.n_k {
                    if (c.causal && j as i64 > i as i64 + c.causal_offset()) || j >= len {
                        continue;
                    }
                    let at = b * mstr[0] + h * mstr[1] + i * mstr[2] + j * mstr[3];
                    if extras.mask.is_some_and(|m| !m[at]) {
                        continue;
                    }
                    let kj = &k[b * ksb + hk * ksh + j * ksn..][..c.d];
                    let dot: f64 = qi.iter().zip(kj).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
                    let s = dot * scale + extras.bias.map_or(0.0, |bias| f64::from(bias[at]));
                    if s != f64::NEG_INFINITY {
                        scores.push((j, s));
                    }
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let row = &mut out[b * qsb + h * qsh + i * qsn..][..c.d];
                let mut l = 0.0;
                for &(j, s) in &scores {
                    let p = (s - m).exp();
                    l += p;
                    let vj = &v[b * ksb + hk * ksh + j * ksn..][..c.d];
                    for (o, &x) in row.iter_mut().zip(vj) {
                        *o += p * f64::from(x);
                    }
                }
                if l != 0.0 {
                    row.iter_mut().for_each(|o| *o /= l);
                }
            }
        }
    }
    out
}
