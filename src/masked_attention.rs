//! Attention as models use it: batched multi-head `(B, H, N, D)` inputs, causal and padding
//! masks, and flash-decoding (one query against a long key cache, split across threads).
//!
//! All programs are plain loop IR in the style of [`online_attention_qb_ir`]: online softmax
//! with base-2 exponentials, one THREAD range that flattens (batch, head, query block) so that
//! both cores are busy even at `B = H = 1`, and head-dimension loops innermost with constant
//! trip counts so they vectorize.
//!
//! Masked keys get the score `-inf`; the running max starts at the finite floor [`M_FLOOR`]
//! instead of `-inf`, so `m_old - m_new` is always finite and the recurrence never evaluates
//! `exp2(-inf - (-inf))`. A masked key then contributes `exp2(-inf) = 0`, and a query row whose
//! keys are all masked ends with `l = 0`, `o = 0`: its output is defined as zeros.
//!
//! [`online_attention_qb_ir`]: crate::attention::online_attention_qb_ir

use crate::attention::{LOG2E, query_block};
use uopc_ir::{AxisType, DType, UOp, alloc, buffer, f32c, range, sink};
use uopc_jit::{Arg, BufRef, JitError, Program};

/// The running max starts here rather than at `-inf`: real (scaled) scores are far above it,
/// and keeping it finite is what keeps `exp2(m_old - m_new)` defined when every key so far was
/// masked. Scores below it are treated as masked.
pub const M_FLOOR: f32 = -1.0e30;

/// Sizes of a batched multi-head attention: q is `(batch, heads, n_q, d)`, k and v are
/// `(batch, heads, n_k, d)`, all row-major f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch items.
    pub batch: usize,
    /// Heads per batch item.
    pub heads: usize,
    /// Query rows per head.
    pub n_q: usize,
    /// Key (and value) rows per head.
    pub n_k: usize,
    /// Head dimension.
    pub d: usize,
}

impl AttentionShape {
    /// One batch item and one head.
    pub fn single(n_q: usize, n_k: usize, d: usize) -> Self {
        AttentionShape { batch: 1, heads: 1, n_q, n_k, d }
    }
    /// Elements of q (and of the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.n_q * self.d
    }
    /// Elements of k (and of v).
    pub fn kv_len(&self) -> usize {
        self.batch * self.heads * self.n_k * self.d
    }
    /// Elements of a full boolean mask `(batch, n_q, n_k)` (shared by all heads).
    pub fn mask_len(&self) -> usize {
        self.batch * self.n_q * self.n_k
    }
    /// How far keys run ahead of queries: query `i` may see keys `j <= i + causal_offset()`
    /// under a causal mask (queries are aligned to the end of the keys).
    pub fn causal_offset(&self) -> i64 {
        self.n_k as i64 - self.n_q as i64
    }
    fn check(&self) -> Result<(), JitError> {
        if [self.batch, self.heads, self.n_q, self.n_k, self.d].contains(&0) {
            return Err(JitError::Unsupported(format!("attention shape {self:?} has an empty axis")));
        }
        Ok(())
    }
    /// Bytes of K and V one attention pass must read at least.
    pub fn kv_bytes(&self) -> usize {
        2 * self.kv_len() * std::mem::size_of::<f32>()
    }
}

/// How the causal mask is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Causal {
    /// No causal mask.
    None,
    /// Every key is visited; future keys get a `-inf` score through a WHERE.
    Where,
    /// The key loop ends at the last key the query block may see (a RANGE whose end is an
    /// expression of the THREAD range), so masked keys cost nothing; only the diagonal of a
    /// query block is masked with a WHERE.
    Ragged,
}

/// Padding masks (combined with the causal mask when both are given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// No padding mask.
    None,
    /// Buffer 4 holds `batch` i32 key lengths: item `b` attends keys `j < len[b]` only.
    KeyLengths,
    /// Buffer 4 holds a `(batch, n_q, n_k)` bool mask, shared by all heads; `true` = attend.
    Mask,
}

/// Which masks a [`masked_attention_ir`] kernel applies, and how many query rows each THREAD
/// iteration processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskSpec {
    /// The causal mask.
    pub causal: Causal,
    /// The padding mask.
    pub padding: Padding,
    /// Query rows per THREAD iteration, rounded down to a divisor of `n_q`.
    pub query_block: usize,
}

impl Default for MaskSpec {
    fn default() -> Self {
        MaskSpec { causal: Causal::None, padding: Padding::None, query_block: 4 }
    }
}

/// `min(a, b)` for index expressions, as `-max(-a, -b)`: the bounds analysis then knows the
/// result is at most either operand.
fn min_idx(a: &UOp, b: &UOp) -> UOp {
    -((-a).maximum(-b))
}

/// Batched multi-head online-softmax attention with optional causal and padding masks.
///
/// Buffers: 0 = Q, 1 = K, 2 = V (shapes in [`AttentionShape`]), 3 = output (like Q), and for
/// [`Padding::KeyLengths`] / [`Padding::Mask`] buffer 4 as described there. One THREAD
/// iteration owns one block of query rows of one (batch, head); its output rows are contiguous,
/// so iterations write disjoint memory and run in parallel.
pub fn masked_attention_ir(shape: &AttentionShape, spec: &MaskSpec) -> UOp {
    let AttentionShape { batch, heads, n_q, n_k, d } = *shape;
    let qb = query_block(n_q, spec.query_block);
    let nb = n_q / qb;
    let f32t = DType::F32;
    let q = buffer(0, f32t, shape.q_len());
    let k = buffer(1, f32t, shape.kv_len());
    let v = buffer(2, f32t, shape.kv_len());
    let out = buffer(3, f32t, shape.q_len());
    let lens = (spec.padding == Padding::KeyLengths).then(|| buffer(4, DType::I32, batch));
    let mask = (spec.padding == Padding::Mask).then(|| buffer(4, DType::Bool, shape.mask_len()));

    let m: Vec<UOp> = (0..qb).map(|b| alloc(b, f32t, 1)).collect();
    let l: Vec<UOp> = (0..qb).map(|b| alloc(qb + b, f32t, 1)).collect();
    let s: Vec<UOp> = (0..qb).map(|b| alloc(2 * qb + b, f32t, 1)).collect();
    let o = alloc(3 * qb, f32t, qb * d);
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let off = shape.causal_offset();

    // t = (batch * heads + head) * nb + block; q and out rows of t are rows t*qb .. t*qb + qb.
    let t = range(batch * heads * nb, 0, AxisType::Thread);
    let bh = t.idiv(nb as i64);
    let blk = t.modulo(nb as i64);
    let item = t.idiv((heads * nb) as i64);
    let row_in_head = |b: usize| &blk * qb + b;
    let flat_row = |b: usize| &t * qb + b;

    let th = std::slice::from_ref(&t);
    let (mi, li): (Vec<UOp>, Vec<UOp>) =
        (m.iter().map(|x| x.after(th)).collect(), l.iter().map(|x| x.after(th)).collect());
    let oi = o.after(th);
    let init_m: Vec<UOp> = mi.iter().map(|x| x.index(0).store(f32c(M_FLOOR))).collect();
    let init_l: Vec<UOp> = li.iter().map(|x| x.index(0).store(0.0f32)).collect();
    let d0 = range(qb * d, 1, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let j = match spec.causal {
        // the last row of the block sees keys j < blk*qb + qb + off; earlier rows are masked
        Causal::Ragged => range(&blk * qb + (qb as i64 + off), 2, AxisType::Reduce),
        _ => range(n_k, 2, AxisType::Reduce),
    };
    let sj: Vec<UOp> = s.iter().map(|x| x.after(&[t.clone(), j.clone()])).collect();
    let init_s: Vec<UOp> = sj.iter().map(|x| x.index(0).store(0.0f32)).collect();
    let e = range(d, 3, AxisType::Reduce);
    let kje = k.index((&bh * n_k + &j) * d + &e).load();
    let dots: Vec<UOp> = (0..qb)
        .map(|b| {
            let se = sj[b].after(&[init_s[b].clone(), e.clone()]);
            se.index(0).store(se.index(0).load() + q.index(flat_row(b) * d + &e).load() * &kje)
        })
        .collect();
    let dot = sink(&dots).end(&[e]);

    let mut updates = Vec::new();
    let (mut corr, mut p) = (Vec::new(), Vec::new());
    for b in 0..qb {
        let mut score = sj[b].after(std::slice::from_ref(&dot)).index(0).load() * scale;
        let mut keep: Vec<UOp> = Vec::new();
        let causal_where = match spec.causal {
            Causal::Where => true,
            Causal::Ragged => b + 1 < qb, // the loop end already masks the block's last row
            Causal::None => false,
        };
        if causal_where {
            keep.push(j.lt(row_in_head(b) + (off + 1)));
        }
        if let Some(lens) = &lens {
            keep.push(j.lt(lens.index(&item).load().cast(DType::INDEX)));
        }
        if let Some(mask) = &mask {
            keep.push(mask.index((&item * n_q + row_in_head(b)) * n_k + &j).load());
        }
        for c in keep {
            score = c.where_(&score, f32c(f32::NEG_INFINITY));
        }
        // read m and l only after the dot products, so they are not live across that loop
        let after_dot = |x: &UOp, init: &UOp| x.after(&[init.clone(), j.clone(), dot.clone()]);
        let (mj, lj) = (after_dot(&mi[b], &init_m[b]), after_dot(&li[b], &init_l[b]));
        let m_old = mj.index(0).load();
        let m_new = m_old.maximum(&score);
        corr.push((&m_old - &m_new).exp2());
        p.push((&score - &m_new).exp2());
        updates.push(lj.index(0).store(lj.index(0).load() * &corr[b] + &p[b]));
        updates.push(mj.index(0).store(&m_new));
    }
    let dd = range(d, 4, AxisType::Loop);
    let od = oi.after(&[init_o, j.clone()]);
    let vjd = v.index((&bh * n_k + &j) * d + &dd).load();
    let o_updates: Vec<UOp> = (0..qb)
        .map(|b| {
            let at = od.index(&dd + b * d);
            at.store(at.load() * &corr[b] + &p[b] * &vjd)
        })
        .collect();
    updates.push(sink(&o_updates).end(&[dd]));
    let loop_j = sink(&updates).end(&[j]);

    let d2 = range(d, 5, AxisType::Loop);
    let done = std::slice::from_ref(&loop_j);
    let stores: Vec<UOp> = (0..qb)
        .map(|b| {
            let lb = li[b].after(done).index(0).load();
            // a fully masked row has l = 0 and o = 0: its output is 0, not 0 * inf
            let inv_l = f32c(0.0).lt(&lb).where_(lb.recip(), f32c(0.0));
            out.index(flat_row(b) * d + &d2).store(oi.after(done).index(&d2 + b * d).load() * inv_l)
        })
        .collect();
    sink(&[sink(&stores).end(&[d2, t])])
}

/// The data of a padding mask, matching [`Padding`].
#[derive(Clone, Copy, Debug)]
pub enum PadData<'a> {
    /// No padding mask.
    None,
    /// `batch` key lengths.
    KeyLengths(&'a [i32]),
    /// A `(batch, n_q, n_k)` mask, `true` = attend.
    Mask(&'a [bool]),
}

impl PadData<'_> {
    /// The kind of mask this data is for.
    pub fn kind(&self) -> Padding {
        match self {
            PadData::None => Padding::None,
            PadData::KeyLengths(_) => Padding::KeyLengths,
            PadData::Mask(_) => Padding::Mask,
        }
    }

    /// Appends the mask buffer (if any) to a kernel's arguments, after checking it is the
    /// kind of padding `who` was compiled for.
    fn push_arg<'a>(&self, expected: Padding, who: &str, args: &mut Vec<Arg<'a>>) -> Result<(), JitError>
    where
        Self: 'a,
    {
        if self.kind() != expected {
            return Err(JitError::Argument(format!(
                "{who}: compiled for padding {expected:?}, got {:?}",
                self.kind()
            )));
        }
        match *self {
            PadData::None => {}
            PadData::KeyLengths(x) => args.push(Arg::Read(BufRef::I32(x))),
            PadData::Mask(x) => args.push(Arg::Read(BufRef::Bool(x))),
        }
        Ok(())
    }
}

/// A compiled [`masked_attention_ir`] kernel with its shape and masks.
#[derive(Debug)]
pub struct MaskedAttention {
    /// The compiled kernel.
    pub program: Program,
    /// Its shape.
    pub shape: AttentionShape,
    /// Its masks.
    pub spec: MaskSpec,
}

impl MaskedAttention {
    /// Builds and compiles the kernel.
    pub fn compile(shape: AttentionShape, spec: MaskSpec) -> Result<Self, JitError> {
        shape.check()?;
        let name = format!("attention_{:?}_{:?}", spec.causal, spec.padding).to_lowercase();
        let program = Program::compile(&masked_attention_ir(&shape, &spec), &name)?;
        Ok(MaskedAttention { program, shape, spec })
    }

    /// Runs it: `out = attention(q, k, v)` under the masks; `pad` must match the spec.
    pub fn run(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pad: PadData<'_>,
        out: &mut [f32],
    ) -> Result<(), JitError> {
        let mut args: Vec<Arg<'_>> = vec![q.into(), k.into(), v.into(), out.into()];
        pad.push_arg(self.spec.padding, self.program.name(), &mut args)?;
        self.program.run(&mut args)
    }
}

/// Keys flash-decoding processes per step of its key loop: their dot products are
/// independent, and they share one rescale of the running state.
pub const DECODE_KEY_BLOCK: usize = 4;

/// How flash-decoding splits `n_k` keys: `(chunk_size, chunks)` with at most `want` chunks,
/// none of them empty, and chunk sizes a multiple of [`DECODE_KEY_BLOCK`].
pub fn decode_chunks(n_k: usize, want: usize) -> (usize, usize) {
    let size = n_k.div_ceil(want.clamp(1, n_k.max(1))).next_multiple_of(DECODE_KEY_BLOCK);
    (size, n_k.div_ceil(size.max(1)))
}

/// Flash-decoding, kernel 1: the partial online-softmax state of each key chunk.
///
/// `shape.n_q` must be 1. THREAD iteration `t = (batch * heads + head) * chunks + c` runs the
/// online recurrence over keys `c*size .. min((c+1)*size, n_k)` ([`decode_chunks`]),
/// [`DECODE_KEY_BLOCK`] keys per step, and writes its unnormalized state: running max
/// (base-2 scaled scores) to buffer 3, running sum to buffer 4, and output row to buffer 5
/// (`d` floats per chunk). Buffers 0-2 = Q, K, V; with a `padding` mask, buffer 6 holds it as
/// in [`Padding`] (a [`Padding::Mask`] is `(batch, 1, n_k)`): a padded KV cache.
pub fn flash_decode_partial_ir(shape: &AttentionShape, want_chunks: usize, padding: Padding) -> UOp {
    let AttentionShape { batch, heads, n_k, d, .. } = *shape;
    let kb = DECODE_KEY_BLOCK;
    let (size, chunks) = decode_chunks(n_k, want_chunks);
    let bhn = batch * heads;
    let f32t = DType::F32;
    let q = buffer(0, f32t, bhn * d);
    let k = buffer(1, f32t, shape.kv_len());
    let v = buffer(2, f32t, shape.kv_len());
    let (pm, pl, po) =
        (buffer(3, f32t, bhn * chunks), buffer(4, f32t, bhn * chunks), buffer(5, f32t, bhn * chunks * d));
    let lens = (padding == Padding::KeyLengths).then(|| buffer(6, DType::I32, batch));
    let mask = (padding == Padding::Mask).then(|| buffer(6, DType::Bool, batch * n_k));
    let (m, l, o) = (alloc(0, f32t, 1), alloc(1, f32t, 1), alloc(2, f32t, d));
    let s: Vec<UOp> = (0..kb).map(|u| alloc(3 + u, f32t, 1)).collect();
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let neg_inf = || f32c(f32::NEG_INFINITY);

    let t = range(bhn * chunks, 0, AxisType::Thread);
    let bh = t.idiv(chunks as i64);
    let c = t.modulo(chunks as i64);
    let item = t.idiv((heads * chunks) as i64);
    let th = std::slice::from_ref(&t);
    let (mi, li, oi) = (m.after(th), l.after(th), o.after(th));
    let init_m = mi.index(0).store(f32c(M_FLOOR));
    let init_l = li.index(0).store(0.0f32);
    let d0 = range(d, 1, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let start = &c * size;
    // The last chunk may be short (and end inside a key block): the loop stops after its last
    // block, keys past n_k are masked, and the min on the key index lets bounds analysis prove
    // every access inside K and V.
    let blocks_left = (-&start + (n_k + kb - 1) as i64).idiv(kb as i64);
    let jb = range(min_idx(&uopc_ir::idx((size / kb) as i64), &blocks_left), 2, AxisType::Reduce);
    let raw: Vec<UOp> = (0..kb).map(|u| &start + &jb * kb + u).collect();
    let key_in_head: Vec<UOp> = raw.iter().map(|r| min_idx(r, &uopc_ir::idx(n_k as i64 - 1))).collect();
    let key: Vec<UOp> = key_in_head.iter().map(|x| &bh * n_k + x).collect();

    let sj: Vec<UOp> = s.iter().map(|x| x.after(&[t.clone(), jb.clone()])).collect();
    let init_s: Vec<UOp> = sj.iter().map(|x| x.index(0).store(0.0f32)).collect();
    let e = range(d, 3, AxisType::Reduce);
    let qe = q.index(&bh * d + &e).load();
    let dots: Vec<UOp> = (0..kb)
        .map(|u| {
            let se = sj[u].after(&[init_s[u].clone(), e.clone()]);
            se.index(0).store(se.index(0).load() + &qe * k.index(&key[u] * d + &e).load())
        })
        .collect();
    let dot = sink(&dots).end(&[e]);

    let scores: Vec<UOp> = (0..kb)
        .map(|u| {
            let mut score = sj[u].after(std::slice::from_ref(&dot)).index(0).load() * scale;
            if !n_k.is_multiple_of(kb) {
                score = raw[u].lt(n_k as i64).where_(&score, neg_inf());
            }
            if let Some(lens) = &lens {
                let len = lens.index(&item).load().cast(DType::INDEX);
                score = key_in_head[u].lt(len).where_(&score, neg_inf());
            }
            if let Some(mask) = &mask {
                score = mask.index(&item * n_k + &key_in_head[u]).load().where_(&score, neg_inf());
            }
            score
        })
        .collect();
    let deps = [init_m, jb.clone(), dot.clone()];
    let mj = mi.after(&deps);
    let lj = li.after(&[init_l, jb.clone(), dot]);
    let m_old = mj.index(0).load();
    let m_new = scores.iter().fold(m_old.clone(), |a, x| a.maximum(x));
    let corr = (&m_old - &m_new).exp2();
    let p: Vec<UOp> = scores.iter().map(|x| (x - &m_new).exp2()).collect();
    let p_sum = p[1..].iter().fold(p[0].clone(), |a, x| a + x);
    let st_l = lj.index(0).store(lj.index(0).load() * &corr + p_sum);
    let dd = range(d, 4, AxisType::Loop);
    let od = oi.after(&[init_o, jb.clone()]);
    let pv = (1..kb).fold(&p[0] * v.index(&key[0] * d + &dd).load(), |a, u| {
        a + &p[u] * v.index(&key[u] * d + &dd).load()
    });
    let st_o = od.index(&dd).store(od.index(&dd).load() * &corr + pv).end(&[dd]);
    let st_m = mj.index(0).store(&m_new);
    let loop_j = sink(&[st_l, st_o, st_m]).end(&[jb]);

    let done = std::slice::from_ref(&loop_j);
    let w_m = pm.index(&t).store(mi.after(done).index(0).load());
    let w_l = pl.index(&t).store(li.after(done).index(0).load());
    let d2 = range(d, 5, AxisType::Loop);
    let w_o = po.index(&t * d + &d2).store(oi.after(done).index(&d2).load()).end(&[d2]);
    sink(&[sink(&[w_m, w_l, w_o]).end(&[t])])
}

/// Flash-decoding, kernel 2: merges `chunks` partial states per (batch, head) with the rule of
/// section 11.6 and normalizes.
///
/// With `m = max_c m_c`, the union is `l = sum_c l_c 2^(m_c - m)`, `o = sum_c o_c 2^(m_c - m)`,
/// and the output row is `o / l` (zeros when `l = 0`: every key masked). Buffers: 0 = max,
/// 1 = sum (`bh * chunks` each), 2 = output rows (`bh * chunks * d`), 3 = result (`bh * d`).
pub fn flash_decode_merge_ir(bh: usize, chunks: usize, d: usize) -> UOp {
    let f32t = DType::F32;
    let (pm, pl, po) =
        (buffer(0, f32t, bh * chunks), buffer(1, f32t, bh * chunks), buffer(2, f32t, bh * chunks * d));
    let out = buffer(3, f32t, bh * d);
    let (m, l, o) = (alloc(0, f32t, 1), alloc(1, f32t, 1), alloc(2, f32t, d));

    let t = range(bh, 0, AxisType::Thread);
    let th = std::slice::from_ref(&t);
    let (mi, li, oi) = (m.after(th), l.after(th), o.after(th));
    let init_m = mi.index(0).store(f32c(M_FLOOR));
    let init_l = li.index(0).store(0.0f32);
    let d0 = range(d, 1, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let c1 = range(chunks, 2, AxisType::Reduce);
    let mc = mi.after(&[init_m, c1.clone()]);
    let max_loop =
        mc.index(0).store(mc.index(0).load().maximum(pm.index(&t * chunks + &c1).load())).end(&[c1]);
    let m_all = mi.after(&[max_loop]).index(0).load();

    let c = range(chunks, 3, AxisType::Reduce);
    let w = (pm.index(&t * chunks + &c).load() - &m_all).exp2();
    let lc = li.after(&[init_l, c.clone()]);
    let st_l = lc.index(0).store(lc.index(0).load() + pl.index(&t * chunks + &c).load() * &w);
    let e = range(d, 4, AxisType::Loop);
    let oc = oi.after(&[init_o, c.clone()]);
    let st_o =
        oc.index(&e).store(oc.index(&e).load() + po.index((&t * chunks + &c) * d + &e).load() * &w).end(&[e]);
    let loop_c = sink(&[st_l, st_o]).end(&[c]);

    let done = std::slice::from_ref(&loop_c);
    let lt = li.after(done).index(0).load();
    let inv_l = f32c(0.0).lt(&lt).where_(lt.recip(), f32c(0.0));
    let d2 = range(d, 5, AxisType::Loop);
    let st = out.index(&t * d + &d2).store(oi.after(done).index(&d2).load() * inv_l);
    sink(&[st.end(&[d2, t])])
}

/// Scratch memory of flash-decoding: the partial states between the two kernels.
#[derive(Clone, Debug, Default)]
pub struct DecodeScratch {
    /// Partial running maxima, `bh * chunks`.
    pub m: Vec<f32>,
    /// Partial running sums, `bh * chunks`.
    pub l: Vec<f32>,
    /// Partial output rows, `bh * chunks * d`.
    pub o: Vec<f32>,
}

/// Flash-decoding of one query per (batch, head) against `n_k` keys: both kernels compiled.
#[derive(Debug)]
pub struct FlashDecode {
    /// Kernel 1 ([`flash_decode_partial_ir`]).
    pub partial: Program,
    /// Kernel 2 ([`flash_decode_merge_ir`]).
    pub merge: Program,
    /// The shape (`n_q == 1`).
    pub shape: AttentionShape,
    /// Keys per chunk.
    pub chunk_size: usize,
    /// Chunks per (batch, head).
    pub chunks: usize,
    /// The padding mask kernel 1 applies.
    pub padding: Padding,
}

impl FlashDecode {
    /// Compiles both kernels, splitting the keys into at most `want_chunks` chunks per head,
    /// with an optional padding mask (see [`flash_decode_partial_ir`]).
    pub fn compile(shape: AttentionShape, want_chunks: usize, padding: Padding) -> Result<Self, JitError> {
        shape.check()?;
        if shape.n_q != 1 {
            return Err(JitError::Unsupported(format!("flash-decoding needs n_q = 1, got {}", shape.n_q)));
        }
        let (chunk_size, chunks) = decode_chunks(shape.n_k, want_chunks);
        let partial =
            Program::compile(&flash_decode_partial_ir(&shape, want_chunks, padding), "decode_partial")?;
        let merge = Program::compile(
            &flash_decode_merge_ir(shape.batch * shape.heads, chunks, shape.d),
            "decode_merge",
        )?;
        Ok(FlashDecode { partial, merge, shape, chunk_size, chunks, padding })
    }

    /// Scratch buffers of the right sizes.
    pub fn scratch(&self) -> DecodeScratch {
        let n = self.shape.batch * self.shape.heads * self.chunks;
        DecodeScratch { m: vec![0.0; n], l: vec![0.0; n], o: vec![0.0; n * self.shape.d] }
    }

    /// Runs kernel 1 then kernel 2 with the given scratch memory; `pad` must match the
    /// padding compiled for.
    pub fn run_with(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pad: PadData<'_>,
        scratch: &mut DecodeScratch,
        out: &mut [f32],
    ) -> Result<(), JitError> {
        let mut args: Vec<Arg<'_>> = vec![
            q.into(),
            k.into(),
            v.into(),
            scratch.m.as_mut_slice().into(),
            scratch.l.as_mut_slice().into(),
            scratch.o.as_mut_slice().into(),
        ];
        pad.push_arg(self.padding, "flash-decoding", &mut args)?;
        self.partial.run(&mut args)?;
        self.merge.run_f32(&[&scratch.m, &scratch.l, &scratch.o], &mut [out])
    }

    /// Runs both kernels: `out` (`batch * heads * d`) = attention of each head's query.
    pub fn run(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pad: PadData<'_>,
        out: &mut [f32],
    ) -> Result<(), JitError> {
        let mut scratch = self.scratch();
        self.run_with(q, k, v, pad, &mut scratch, out)
    }

    /// Bytes of K and V one run reads (the traffic that bounds its speed).
    pub fn kv_bytes(&self) -> usize {
        self.shape.kv_bytes()
    }
}

/// The f64 reference for [`MaskedAttention`] and [`FlashDecode`] outputs: plain two-pass
/// softmax per query row over the keys it may attend (`causal`: `j <= i + causal_offset()`;
/// `pad` as in [`PadData`]); rows with no key are zeros. For accuracy checks in benches.
pub fn masked_attention_reference(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    causal: bool,
    pad: PadData<'_>,
) -> Vec<f64> {
    let AttentionShape { batch, heads, n_q, n_k, d } = *shape;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; shape.q_len()];
    for b in 0..batch {
        for h in 0..heads {
            let bh = b * heads + h;
            for i in 0..n_q {
                let attends = |j: usize| {
                    let c = !causal || (j as i64) <= i as i64 + shape.causal_offset();
                    c && match pad {
                        PadData::None => true,
                        PadData::KeyLengths(l) => (j as i64) < l[b] as i64,
                        PadData::Mask(m) => m[(b * n_q + i) * n_k + j],
                    }
                };
                let keys: Vec<usize> = (0..n_k).filter(|&j| attends(j)).collect();
                let qi = &q[(bh * n_q + i) * d..][..d];
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kj = &k[(bh * n_k + j) * d..][..d];
                        qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = p.iter().sum();
                let row = &mut out[(bh * n_q + i) * d..][..d];
                for (pj, &j) in p.iter().zip(&keys) {
                    for (e, o) in row.iter_mut().enumerate() {
                        *o += pj / l * v[(bh * n_k + j) * d + e] as f64;
                    }
                }
            }
        }
    }
    out
}

/// Streaming read bandwidth in GB/s: the best of `reps` sums of an `mb`-MiB f32 array split
/// over `threads` threads. The yardstick for memory-bound kernels such as flash-decoding.
pub fn streaming_read_gbs(mb: usize, threads: usize, reps: usize) -> f64 {
    let data = vec![1.0f32; mb * (1 << 20) / 4];
    let threads = threads.max(1);
    let part = data.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    let mut check = 0.0f32;
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        let total: f32 = std::thread::scope(|sc| {
            let hs: Vec<_> = data.chunks(part).map(|c| sc.spawn(move || sum_f32(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        check += total;
    }
    // keeps the sums observable so they are not optimized away
    std::hint::black_box(check);
    (data.len() * 4) as f64 / best / 1e9
}

/// A sum with 16 independent partial sums, so the loop is bound by loads, not add latency.
fn sum_f32(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}
