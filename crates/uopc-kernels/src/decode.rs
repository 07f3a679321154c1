//! Flash-decoding: one query per (batch, head) against a long key cache. The keys are split
//! into chunks, one THREAD iteration each, so that both cores stream the cache even at
//! `B = H = 1`; a second kernel merges the chunks' partial online-softmax states.
//!
//! Masking follows [`crate::masked`]: masked keys score `-inf`, the running max starts at
//! [`M_FLOOR`], and a row whose keys are all masked outputs zeros.

use crate::LOG2E;
use crate::masked::{AttentionShape, M_FLOOR, PadData, Padding, min_idx};
use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, sink};
use uopc_jit::{Arg, JitError, Program};

/// Keys flash-decoding processes per step of its key loop: their dot products are
/// independent, and they share one rescale of the running state.
pub const DECODE_KEY_BLOCK: usize = 4;

/// How flash-decoding splits `n_k` keys: `(chunk_size, chunks)` with at most `want` chunks,
/// none of them empty, and chunk sizes a multiple of [`DECODE_KEY_BLOCK`].
///
/// # Examples
///
/// ```rust
/// use uopc_kernels::decode::decode_chunks;
///
/// // 100 keys in at most 8 chunks: 13 rounds up to 16 keys per chunk, so 7 chunks.
/// assert_eq!(decode_chunks(100, 8), (16, 7));
/// assert_eq!(decode_chunks(3, 8), (4, 1));
/// ```
#[must_use]
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
#[must_use]
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
    let mut pb = ProgramBuilder::new();
    let (m, l, o) = (pb.alloc(f32t, 1), pb.alloc(f32t, 1), pb.alloc(f32t, d));
    let s: Vec<UOp> = (0..kb).map(|_| pb.alloc(f32t, 1)).collect();
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let neg_inf = || f32c(f32::NEG_INFINITY);

    let t = pb.range(bhn * chunks, AxisType::Thread);
    let bh = t.idiv(chunks as i64);
    let c = t.modulo(chunks as i64);
    let item = t.idiv((heads * chunks) as i64);
    let th = std::slice::from_ref(&t);
    let (mi, li, oi) = (m.after(th), l.after(th), o.after(th));
    let init_m = mi.index(0).store(f32c(M_FLOOR));
    let init_l = li.index(0).store(0.0f32);
    let d0 = pb.range(d, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let start = &c * size;
    // The last chunk may be short (and end inside a key block): the loop stops after its last
    // block, keys past n_k are masked, and the min on the key index lets bounds analysis prove
    // every access inside K and V.
    let blocks_left = (-&start + (n_k + kb - 1) as i64).idiv(kb as i64);
    let jb = pb.range(min_idx(&uopc_ir::idx((size / kb) as i64), &blocks_left), AxisType::Reduce);
    let raw: Vec<UOp> = (0..kb).map(|u| &start + &jb * kb + u).collect();
    let key_in_head: Vec<UOp> = raw.iter().map(|r| min_idx(r, &uopc_ir::idx(n_k as i64 - 1))).collect();
    let key: Vec<UOp> = key_in_head.iter().map(|x| &bh * n_k + x).collect();

    let sj: Vec<UOp> = s.iter().map(|x| x.after(&[t.clone(), jb.clone()])).collect();
    let init_s: Vec<UOp> = sj.iter().map(|x| x.index(0).store(0.0f32)).collect();
    let e = pb.range(d, AxisType::Reduce);
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
    let dd = pb.range(d, AxisType::Loop);
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
    let d2 = pb.range(d, AxisType::Loop);
    let w_o = po.index(&t * d + &d2).store(oi.after(done).index(&d2).load()).end(&[d2]);
    sink(&[sink(&[w_m, w_l, w_o]).end(&[t])])
}

/// Flash-decoding, kernel 2: merges `chunks` partial states per (batch, head) and normalizes.
///
/// With `m = max_c m_c`, the union is `l = sum_c l_c 2^(m_c - m)`, `o = sum_c o_c 2^(m_c - m)`,
/// and the output row is `o / l` (zeros when `l = 0`: every key masked). Buffers: 0 = max,
/// 1 = sum (`bh * chunks` each), 2 = output rows (`bh * chunks * d`), 3 = result (`bh * d`).
#[must_use]
pub fn flash_decode_merge_ir(bh: usize, chunks: usize, d: usize) -> UOp {
    let f32t = DType::F32;
    let (pm, pl, po) =
        (buffer(0, f32t, bh * chunks), buffer(1, f32t, bh * chunks), buffer(2, f32t, bh * chunks * d));
    let out = buffer(3, f32t, bh * d);
    let mut pb = ProgramBuilder::new();
    let (m, l, o) = (pb.alloc(f32t, 1), pb.alloc(f32t, 1), pb.alloc(f32t, d));

    let t = pb.range(bh, AxisType::Thread);
    let th = std::slice::from_ref(&t);
    let (mi, li, oi) = (m.after(th), l.after(th), o.after(th));
    let init_m = mi.index(0).store(f32c(M_FLOOR));
    let init_l = li.index(0).store(0.0f32);
    let d0 = pb.range(d, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let c1 = pb.range(chunks, AxisType::Reduce);
    let mc = mi.after(&[init_m, c1.clone()]);
    let max_loop =
        mc.index(0).store(mc.index(0).load().maximum(pm.index(&t * chunks + &c1).load())).end(&[c1]);
    let m_all = mi.after(&[max_loop]).index(0).load();

    let c = pb.range(chunks, AxisType::Reduce);
    let w = (pm.index(&t * chunks + &c).load() - &m_all).exp2();
    let lc = li.after(&[init_l, c.clone()]);
    let st_l = lc.index(0).store(lc.index(0).load() + pl.index(&t * chunks + &c).load() * &w);
    let e = pb.range(d, AxisType::Loop);
    let oc = oi.after(&[init_o, c.clone()]);
    let st_o =
        oc.index(&e).store(oc.index(&e).load() + po.index((&t * chunks + &c) * d + &e).load() * &w).end(&[e]);
    let loop_c = sink(&[st_l, st_o]).end(&[c]);

    let done = std::slice::from_ref(&loop_c);
    let lt = li.after(done).index(0).load();
    let inv_l = f32c(0.0).lt(&lt).where_(lt.recip(), f32c(0.0));
    let d2 = pb.range(d, AxisType::Loop);
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
    ///
    /// # Errors
    ///
    /// [`JitError::Unsupported`] when an axis of `shape` is empty or `shape.n_q != 1`; the
    /// [`JitError`] of [`Program::compile`] otherwise.
    ///
    /// # Examples
    ///
    /// One query per head against 37 cached keys, in 4 chunks, against the f64 reference:
    ///
    /// ```rust
    /// use uopc_kernels::decode::FlashDecode;
    /// use uopc_kernels::masked::{AttentionShape, PadData, Padding};
    /// use uopc_kernels::reference::{masked_attention_reference, max_abs_err};
    ///
    /// let shape = AttentionShape { batch: 1, heads: 2, n_q: 1, n_k: 37, d: 8 };
    /// let decode = FlashDecode::compile(shape, 4, Padding::None)?;
    /// assert_eq!((decode.chunk_size, decode.chunks), (12, 4));
    ///
    /// let x = |len: usize, seed: usize| -> Vec<f32> {
    ///     (0..len).map(|i| ((i * 31 + seed) % 19) as f32 * 0.1 - 0.9).collect()
    /// };
    /// let (q, k, v) = (x(shape.q_len(), 1), x(shape.kv_len(), 2), x(shape.kv_len(), 3));
    /// let mut out = vec![0.0f32; shape.q_len()];
    /// decode.run(&q, &k, &v, PadData::None, &mut out)?;
    /// let want = masked_attention_reference(&shape, &q, &k, &v, false, PadData::None);
    /// assert!(max_abs_err(&out, &want) < 1e-5);
    ///
    /// let prefill = AttentionShape { n_q: 2, ..shape };
    /// assert!(FlashDecode::compile(prefill, 4, Padding::None).is_err());
    /// # Ok::<(), uopc_jit::JitError>(())
    /// ```
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
    ///
    /// # Errors
    ///
    /// [`JitError::Argument`] when `pad` is not the padding compiled for, or a slice (or a
    /// scratch buffer) does not have its buffer's length.
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
    ///
    /// # Errors
    ///
    /// As [`FlashDecode::run_with`].
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
