//! Online-softmax attention for one head: `softmax(Q K^T / sqrt(D)) V`, row-major `(N, D)`
//! inputs, every key visited once with a running max and sum.

use uopc_ir::{AxisType, DType, ProgramBuilder, UOp, buffer, f32c, sink};

pub use crate::LOG2E;

/// The online-softmax (FlashAttention-style) attention kernel as a loop program.
///
/// One query row per THREAD iteration keeps a running max `m`, running sum `l` and an
/// unnormalized output row `o[D]`; every key is visited once and rescales what was accumulated
/// when the max grows. Buffers: 0 = Q, 1 = K, 2 = V (each `n*d` f32, row-major), 3 = output.
/// Exponentials are base 2, with `log2(e)/sqrt(d)` folded into the score scale.
///
/// # Examples
///
/// Compiled and run against the f64 reference:
///
/// ```rust
/// use uopc_jit::Program;
/// use uopc_kernels::online::online_attention_ir;
/// use uopc_kernels::reference::{attention_f64, max_abs_err};
///
/// let (n, d) = (16, 8);
/// let x = |seed: usize| -> Vec<f32> {
///     (0..n * d).map(|i| ((i * 37 + seed) % 17) as f32 * 0.1 - 0.8).collect()
/// };
/// let (q, k, v) = (x(1), x(2), x(3));
/// let program = Program::compile(&online_attention_ir(n, d), "online")?;
/// let mut out = vec![0.0f32; n * d];
/// program.run_f32(&[&q, &k, &v], &mut [&mut out])?;
/// assert!(max_abs_err(&out, &attention_f64(&q, &k, &v, n, d)) < 1e-5);
/// # Ok::<(), uopc_jit::JitError>(())
/// ```
#[must_use]
pub fn online_attention_ir(n: usize, d: usize) -> UOp {
    online_attention_program(n, d, false)
}

/// The online-softmax program; with `lse`, buffer 4 (`n` f32) also receives each row's base-2
/// log-sum-exp `m + log2 l` (what a backward pass with recompute needs).
pub(crate) fn online_attention_program(n: usize, d: usize, lse: bool) -> UOp {
    let f32t = DType::F32;
    let [q, k, v, out] = [0, 1, 2, 3].map(|slot| buffer(slot, f32t, n * d));
    let mut pb = ProgramBuilder::new();
    let (m, l, o, s) = (pb.alloc(f32t, 1), pb.alloc(f32t, 1), pb.alloc(f32t, d), pb.alloc(f32t, 1));
    let scale = (1.0 / (d as f64).sqrt() * LOG2E) as f32;

    let i = pb.range(n, AxisType::Thread);
    // Running state lives inside the THREAD loop: each query row (and thread) owns its own.
    let (mi, li, oi) = (m.after(&[i.clone()]), l.after(&[i.clone()]), o.after(&[i.clone()]));
    let init_m = mi.index(0).store(f32c(f32::NEG_INFINITY));
    let init_l = li.index(0).store(0.0f32);
    let d0 = pb.range(d, AxisType::Loop);
    let init_o = oi.index(&d0).store(0.0f32).end(&[d0]);

    let j = pb.range(n, AxisType::Reduce);
    // s = (q_i . k_j) * scale
    let sj = s.after(&[i.clone(), j.clone()]);
    let init_s = sj.index(0).store(0.0f32);
    let e = pb.range(d, AxisType::Reduce);
    let se = sj.after(&[init_s, e.clone()]);
    let dot = se
        .index(0)
        .store(se.index(0).load() + q.index(&i * d + &e).load() * k.index(&j * d + &e).load())
        .end(&[e]);
    let score = sj.after(&[dot]).index(0).load() * scale;

    // online softmax update
    let (mj, lj) = (mi.after(&[init_m, j.clone()]), li.after(&[init_l, j.clone()]));
    let m_old = mj.index(0).load();
    let m_new = m_old.maximum(&score);
    let corr = (&m_old - &m_new).exp2(); // rescales everything accumulated so far
    let p = (&score - &m_new).exp2();
    let st_l = lj.index(0).store(lj.index(0).load() * &corr + &p);
    let dd = pb.range(d, AxisType::Loop);
    let od = oi.after(&[init_o, j.clone()]);
    let st_o =
        od.index(&dd).store(od.index(&dd).load() * &corr + &p * v.index(&j * d + &dd).load()).end(&[dd]);
    let st_m = mj.index(0).store(&m_new);
    let loop_j = sink(&[st_l, st_o, st_m]).end(&[j]);

    // normalize
    let d2 = pb.range(d, AxisType::Loop);
    let done = std::slice::from_ref(&loop_j);
    let l_final = li.after(done).index(0).load();
    let st_out = out.index(&i * d + &d2).store(oi.after(done).index(&d2).load() * l_final.recip());
    if !lse {
        return sink(&[st_out.end(&[d2, i])]);
    }
    let row_lse = buffer(4, f32t, n);
    let st_lse = row_lse.index(&i).store(mi.after(done).index(0).load() + l_final.log2());
    sink(&[sink(&[st_out.end(&[d2]), st_lse]).end(&[i])])
}

/// Online-softmax attention with a block of query rows per THREAD iteration (`online_qb`).
///
/// Each loaded key row and value row serves the whole block: the dot products of all rows of
/// the block run in one loop over the head dimension, and so does the rescaled update of their
/// output rows (both loops vectorize). `qb` is rounded
/// down to a divisor of `n` (see [`crate::query_block`]). Buffers as in [`online_attention_ir`].
#[must_use]
pub fn online_attention_qb_ir(n: usize, d: usize, qb: usize) -> UOp {
    // The unmasked, single-head case of the general kernel.
    use crate::masked::{AttentionShape, Causal, MaskSpec, Padding, masked_attention_ir};
    let spec = MaskSpec { causal: Causal::None, padding: Padding::None, query_block: qb };
    masked_attention_ir(&AttentionShape::single(n, n, d), &spec)
}
