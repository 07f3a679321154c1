//! Attention as models use it: batched multi-head `(B, H, N, D)` inputs with causal and
//! padding masks (flash-decoding, one query against a long key cache, is in [`crate::decode`]).
//!
//! The programs are plain loop IR in the style of [`online_attention_qb_ir`]: online softmax
//! with base-2 exponentials, one THREAD range that flattens (batch, head, query block) so that
//! both cores are busy even at `B = H = 1`, and head-dimension loops innermost with constant
//! trip counts so they vectorize.
//!
//! Masked keys get the score `-inf`; the running max starts at the finite floor [`M_FLOOR`]
//! instead of `-inf`, so `m_old - m_new` is always finite and the recurrence never evaluates
//! `exp2(-inf - (-inf))`. A masked key then contributes `exp2(-inf) = 0`, and a query row whose
//! keys are all masked ends with `l = 0`, `o = 0`: its output is defined as zeros.
//!
//! [`online_attention_qb_ir`]: crate::online::online_attention_qb_ir

use crate::LOG2E;
use crate::query_block;
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, sink};
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
    pub(crate) fn check(&self) -> Result<(), JitError> {
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
pub(crate) fn min_idx(a: &UOp, b: &UOp) -> UOp {
    -((-a).maximum(-b))
}

/// Batched multi-head online-softmax attention with optional causal and padding masks.
///
/// Buffers: 0 = Q, 1 = K, 2 = V (shapes in [`AttentionShape`]), 3 = output (like Q), and for
/// [`Padding::KeyLengths`] / [`Padding::Mask`] buffer 4 as described there. One THREAD
/// iteration owns one block of query rows of one (batch, head); its output rows are contiguous,
/// so iterations write disjoint memory and run in parallel.
#[must_use]
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

    let mut pb = ProgramBuilder::new();
    let m: Vec<UOp> = (0..qb).map(|_| pb.alloc(f32t, 1)).collect();
    let l: Vec<UOp> = (0..qb).map(|_| pb.alloc(f32t, 1)).collect();
    let s: Vec<UOp> = (0..qb).map(|_| pb.alloc(f32t, 1)).collect();
    let o = pb.alloc(f32t, qb * d);
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let off = shape.causal_offset();

    // t = (batch * heads + head) * nb + block; q and out rows of t are rows t*qb .. t*qb + qb.
    let t = pb.range(batch * heads * nb, AxisType::Thread);
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
    let d0 = pb.range(qb * d, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let j = match spec.causal {
        // the last row of the block sees keys j < blk*qb + qb + off; earlier rows are masked
        Causal::Ragged => pb.range(&blk * qb + (qb as i64 + off), AxisType::Reduce),
        _ => pb.range(n_k, AxisType::Reduce),
    };
    let sj: Vec<UOp> = s.iter().map(|x| x.after(&[t.clone(), j.clone()])).collect();
    let init_s: Vec<UOp> = sj.iter().map(|x| x.index(0).store(0.0f32)).collect();
    let e = pb.range(d, AxisType::Reduce);
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
    let dd = pb.range(d, AxisType::Loop);
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

    let d2 = pb.range(d, AxisType::Loop);
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
    pub(crate) fn push_arg<'a>(
        &self,
        expected: Padding,
        who: &str,
        args: &mut Vec<Arg<'a>>,
    ) -> Result<(), JitError>
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
    ///
    /// # Errors
    ///
    /// [`JitError::Unsupported`] when an axis of `shape` is empty; the [`JitError`] of
    /// [`Program::compile`] otherwise.
    ///
    /// # Examples
    ///
    /// Two heads of causal attention with per-item key lengths, against the f64 reference:
    ///
    /// ```rust
    /// use uopc_kernels::masked::{AttentionShape, Causal, MaskSpec, MaskedAttention, PadData, Padding};
    /// use uopc_kernels::reference::{masked_attention_reference, max_abs_err};
    ///
    /// let shape = AttentionShape { batch: 2, heads: 2, n_q: 8, n_k: 8, d: 4 };
    /// let spec = MaskSpec { causal: Causal::Ragged, padding: Padding::KeyLengths, query_block: 4 };
    /// let kernel = MaskedAttention::compile(shape, spec)?;
    ///
    /// let x = |len: usize, seed: usize| -> Vec<f32> {
    ///     (0..len).map(|i| ((i * 29 + seed) % 13) as f32 * 0.15 - 0.9).collect()
    /// };
    /// let (q, k, v) = (x(shape.q_len(), 1), x(shape.kv_len(), 2), x(shape.kv_len(), 3));
    /// let lens = [8, 5]; // the second item's last three keys are padding
    /// let mut out = vec![0.0f32; shape.q_len()];
    /// kernel.run(&q, &k, &v, PadData::KeyLengths(&lens), &mut out)?;
    /// let want = masked_attention_reference(&shape, &q, &k, &v, true, PadData::KeyLengths(&lens));
    /// assert!(max_abs_err(&out, &want) < 1e-5);
    ///
    /// // The mask data must be the kind the kernel was compiled for.
    /// assert!(kernel.run(&q, &k, &v, PadData::None, &mut out).is_err());
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
    pub fn compile(shape: AttentionShape, spec: MaskSpec) -> Result<Self, JitError> {
        shape.check()?;
        let name = format!("attention_{:?}_{:?}", spec.causal, spec.padding).to_lowercase();
        let program = Program::compile(&masked_attention_ir(&shape, &spec), &name)?;
        Ok(MaskedAttention { program, shape, spec })
    }

    /// Runs it: `out = attention(q, k, v)` under the masks; `pad` must match the spec.
    ///
    /// # Errors
    ///
    /// [`JitError::Argument`] when `pad` is not the padding compiled for, or a slice's length
    /// is not its buffer's (see [`AttentionShape`]).
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
