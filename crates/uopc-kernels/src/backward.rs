//! The backward pass of attention, two ways: autograd of the Tensor one-liner (unfused: the
//! N x N scores and probabilities are temporaries of the plan), and hand-written loop programs
//! that never hold anything N x N because they recompute the probabilities from Q, K and the
//! per-row log-sum-exp saved by the forward pass (FlashAttention's backward).
//!
//! Notation for one head, row-major `(N, D)` f32 buffers: `s_ij = q_i . k_j / sqrt(D)`,
//! `P = softmax(s)` by rows, `O = P V`, and `dO` the gradient arriving at `O`. Then
//!
//! - `dV = P^T dO`
//! - `dP_ij = dO_i . v_j`, `Delta_i = sum_j P_ij dP_ij = dO_i . O_i`
//! - `dS_ij = P_ij (dP_ij - Delta_i)`
//! - `dQ = dS K / sqrt(D)`, `dK = dS^T Q / sqrt(D)`.
//!
//! The log-sum-exp is kept in base 2, like every exponential in the loop IR:
//! `lse2_i = log2(sum_j 2^(s_ij log2 e)) = log2(e) * ln(sum_j e^(s_ij))`, so
//! `P_ij = exp2(s_ij log2 e - lse2_i)` needs no other constant.
//!
//! The recompute backward is two parallel programs: [`attention_backward_dq_ir`] gives each
//! THREAD iteration one query row (it writes that row of dQ and `Delta_i`), and
//! [`attention_backward_dkdv_ir`] gives each one key row (that row of dK and dV). Each
//! recomputes the scores and probabilities it needs, so no iteration writes another's rows and
//! the JIT proves both race free.

use std::fmt;
use std::sync::Arc;
use uopc_ir::{AxisType, DType, Op, ProgramBuilder, UOp, buffer, sink};
use uopc_jit::{JitError, Program};
use uopc_tensor::{Plan, RealizeOptions, Tensor, TensorError, make_plan, realize, vjp};

use crate::LOG2E;

/// Why building, compiling or running a backward pass failed.
#[derive(Debug)]
pub enum BackwardError {
    /// The tensor layer (autograd, kernelizer, realize) failed.
    Tensor(TensorError),
    /// A loop program failed to compile or run.
    Jit(JitError),
    /// Input slices do not have `n * d` elements.
    Shape(String),
}

impl fmt::Display for BackwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackwardError::Tensor(e) => write!(f, "{e}"),
            BackwardError::Jit(e) => write!(f, "{e}"),
            BackwardError::Shape(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for BackwardError {}

impl From<TensorError> for BackwardError {
    fn from(e: TensorError) -> Self {
        BackwardError::Tensor(e)
    }
}
impl From<JitError> for BackwardError {
    fn from(e: JitError) -> Self {
        BackwardError::Jit(e)
    }
}

/// Result with [`BackwardError`].
pub type Result<T> = std::result::Result<T, BackwardError>;

/// The three input gradients of one attention head, row-major `(N, D)`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads {
    /// Gradient with respect to Q.
    pub dq: Vec<f32>,
    /// Gradient with respect to K.
    pub dk: Vec<f32>,
    /// Gradient with respect to V.
    pub dv: Vec<f32>,
}

/// What a backward pass holds in memory besides its inputs (Q, K, V, dO) and its results
/// (dQ, dK, dV), read from a plan or from loop programs without running them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// Bytes of all temporary buffers together (all are live for the whole run, so this is
    /// also the peak).
    pub temp_bytes: usize,
    /// Elements of the largest temporary buffer.
    pub largest_temp: usize,
    /// Elements of the largest buffer or ALLOC of any kind, inputs and results included.
    pub largest_any: usize,
}

fn check_len(name: &str, x: &[f32], n: usize, d: usize) -> Result<()> {
    if x.len() != n * d {
        return Err(BackwardError::Shape(format!("{name} has {} elements, expected {n} x {d}", x.len())));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// unfused: autograd of the Tensor one-liner

/// Lazy `[dQ, dK, dV]` of `attention(q, k, v)` for the incoming gradient `dout`: reverse-mode
/// autograd through matmul, softmax and the scale, realized like any other tensors.
///
/// # Errors
///
/// [`BackwardError::Tensor`] when autograd fails (`dout` not the output's shape).
///
/// # Panics
///
/// Where [`uopc_tensor::attention::attention`] panics: `q`, `k`, `v` not the 2-D
/// `(n, d)`, `(m, d)`, `(m, e)` attention takes.
pub fn unfused_gradients(q: &Tensor, k: &Tensor, v: &Tensor, dout: &Tensor) -> Result<Vec<Tensor>> {
    let o = uopc_tensor::attention::attention(q, k, v);
    Ok(vjp(&o, &[q, k, v], dout)?)
}

/// The unfused backward: autograd of [`uopc_tensor::attention::attention`], realized with
/// default (unfused) options. Inputs are row-major `(n, d)`.
///
/// # Errors
///
/// [`BackwardError::Shape`] when a slice does not have `n * d` elements;
/// [`BackwardError::Tensor`] when planning or realizing fails.
pub fn backward_unfused(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    n: usize,
    d: usize,
) -> Result<AttentionGrads> {
    for (name, x) in [("q", q), ("k", k), ("v", v), ("dout", dout)] {
        check_len(name, x, n, d)?;
    }
    let t = |x: &[f32]| Tensor::from_vec(x.to_vec(), &[n, d]);
    let grads = unfused_gradients(&t(q), &t(k), &t(v), &t(dout))?;
    let (got, _) = realize(&grads.iter().collect::<Vec<_>>(), &RealizeOptions::default())?;
    let vec = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_ndarray::<f32>()?.into_raw_vec_and_offset().0) };
    Ok(AttentionGrads { dq: vec(&got[0])?, dk: vec(&got[1])?, dv: vec(&got[2])? })
}

/// The plan of the unfused backward at size `(n, d)`: built (and compiled) but not run.
///
/// # Errors
///
/// [`BackwardError::Tensor`] when the graph cannot be planned or compiled (for example an
/// empty axis).
pub fn unfused_backward_plan(n: usize, d: usize) -> Result<Arc<Plan>> {
    // Values do not matter for the plan; only shapes and the graph do.
    let t = || Tensor::from_vec(vec![0.5f32; n * d], &[n, d]);
    let (q, k, v, dout) = (t(), t(), t(), t());
    let grads = unfused_gradients(&q, &k, &v, &dout)?;
    let roots: Vec<UOp> = grads.iter().map(|g| g.uop().clone()).collect();
    Ok(make_plan(&roots, &RealizeOptions::default())?)
}

/// Temporaries of a plan (`Plan::temps`), as [`MemoryUse`].
pub fn plan_memory(plan: &Plan) -> MemoryUse {
    let temp_bytes = plan.temps.iter().map(|&(dt, len)| dt.size() * len).sum();
    let largest_temp = plan.temps.iter().map(|t| t.1).max().unwrap_or(0);
    let largest_any = plan
        .kernels
        .iter()
        .map(|k| largest_buffer(&k.program))
        .chain([largest_temp])
        .chain(plan.outputs.iter().map(|o| o.1))
        .max()
        .unwrap_or(0);
    MemoryUse { temp_bytes, largest_temp, largest_any }
}

/// [`plan_memory`] of [`unfused_backward_plan`].
///
/// # Errors
///
/// As [`unfused_backward_plan`].
pub fn unfused_memory(n: usize, d: usize) -> Result<MemoryUse> {
    let plan = unfused_backward_plan(n, d)?;
    Ok(plan_memory(&plan))
}

// ---------------------------------------------------------------------------------------------
// recompute: loop programs

/// Every BUFFER and ALLOC of a loop program as `(node, elements)`, in creation order.
pub fn program_storage(program: &UOp) -> Vec<(UOp, usize)> {
    let mut v: Vec<(UOp, usize)> = UOp::toposort(std::slice::from_ref(program))
        .into_iter()
        .filter_map(|u| match u.op() {
            Op::Buffer { len, .. } | Op::Alloc { len, .. } => Some((u.clone(), *len)),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// Elements of the largest BUFFER or ALLOC of a loop program.
pub fn largest_buffer(program: &UOp) -> usize {
    program_storage(program).iter().map(|s| s.1).max().unwrap_or(0)
}

/// Online-softmax attention that also writes each row's base-2 log-sum-exp.
///
/// [`crate::online::online_attention_ir`] with one more output: buffers 0 = Q, 1 = K,
/// 2 = V (each `n*d` f32, row-major), 3 = O, 4 = LSE (`n` f32, `m + log2 l` with scores in
/// base 2, i.e. `log2(e)` times the natural log-sum-exp of `q_i . k_j / sqrt(d)`).
#[must_use]
pub fn online_attention_lse_ir(n: usize, d: usize) -> UOp {
    crate::online::online_attention_program(n, d, true)
}

/// The two dot products every backward iteration needs for one (query `qi`, key `kj`) pair:
/// `q_qi . k_kj` and `dO_qi . v_kj`, in one loop over the head dimension (a new range of `pb`), with
/// accumulators living inside the `outer` ranges. Returns both results, read after the loop.
fn two_dots(
    bufs: [&UOp; 4],
    accs: [&UOp; 2],
    qi: &UOp,
    kj: &UOp,
    outer: &[UOp],
    d: usize,
    pb: &mut ProgramBuilder,
) -> (UOp, UOp) {
    let [q, k, v, dout] = bufs;
    let (s, dp) = (accs[0].after(outer), accs[1].after(outer));
    let (init_s, init_dp) = (s.index(0).store(0.0f32), dp.index(0).store(0.0f32));
    let e = pb.range(d, AxisType::Reduce);
    let (se, dpe) = (s.after(&[init_s, e.clone()]), dp.after(&[init_dp, e.clone()]));
    let st_s =
        se.index(0).store(se.index(0).load() + q.index(qi * d + &e).load() * k.index(kj * d + &e).load());
    let st_dp = dpe
        .index(0)
        .store(dpe.index(0).load() + dout.index(qi * d + &e).load() * v.index(kj * d + &e).load());
    let dots = sink(&[st_s, st_dp]).end(&[e]);
    (s.after(&[dots.clone()]).index(0).load(), dp.after(&[dots]).index(0).load())
}

/// dQ (and `Delta`) of attention with recompute, one query row per THREAD iteration.
///
/// Buffers: 0 = Q, 1 = K, 2 = V, 3 = O, 4 = dO (each `n*d` f32), 5 = LSE (`n`, base 2 as
/// written by [`online_attention_lse_ir`]); written: 6 = dQ (`n*d`), 7 = Delta (`n`,
/// `dO_i . O_i`, which [`attention_backward_dkdv_ir`] reads). Row `i` recomputes
/// `P_ij = exp2(q_i . k_j * log2(e)/sqrt(d) - lse_i)` and `dP_ij = dO_i . v_j` for every key
/// and accumulates `dQ_i += P_ij (dP_ij - Delta_i) k_j`; nothing larger than a row is stored.
#[must_use]
pub fn attention_backward_dq_ir(n: usize, d: usize) -> UOp {
    let f32t = DType::F32;
    let [q, k, v, o, dout] = [0, 1, 2, 3, 4].map(|slot| buffer(slot, f32t, n * d));
    let lse = buffer(5, f32t, n);
    let dq_out = buffer(6, f32t, n * d);
    let delta_out = buffer(7, f32t, n);
    let mut pb = ProgramBuilder::new();
    let (acc_delta, dq, s, dp) = (pb.alloc(f32t, 1), pb.alloc(f32t, d), pb.alloc(f32t, 1), pb.alloc(f32t, 1));
    let scale2 = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let scale = (1.0 / (d as f64).sqrt()) as f32;

    let i = pb.range(n, AxisType::Thread);
    // Delta_i = dO_i . O_i
    let ai = acc_delta.after(&[i.clone()]);
    let init_a = ai.index(0).store(0.0f32);
    let e0 = pb.range(d, AxisType::Reduce);
    let ae = ai.after(&[init_a, e0.clone()]);
    let red = ae
        .index(0)
        .store(ae.index(0).load() + dout.index(&i * d + &e0).load() * o.index(&i * d + &e0).load());
    let red = red.end(&[e0]);
    let delta = ai.after(&[red]).index(0).load();
    let st_delta = delta_out.index(&i).store(&delta);

    // per-row dQ accumulator, private to the thread
    let dqi = dq.after(&[i.clone()]);
    let d0 = pb.range(d, AxisType::Loop);
    let init_dq = dqi.index(&d0).store(0.0f32).end(&[d0]);

    let j = pb.range(n, AxisType::Reduce);
    let (sv, dpv) = two_dots([&q, &k, &v, &dout], [&s, &dp], &i, &j, &[i.clone(), j.clone()], d, &mut pb);
    let p = (sv * scale2 - lse.index(&i).load()).exp2();
    let ds = p * (dpv - &delta);
    let dd = pb.range(d, AxisType::Loop);
    let dqj = dqi.after(&[init_dq, j.clone()]);
    let st = dqj.index(&dd).store(dqj.index(&dd).load() + &ds * k.index(&j * d + &dd).load());
    let loop_j = st.end(&[dd, j]);

    let d2 = pb.range(d, AxisType::Loop);
    let st_out = dq_out.index(&i * d + &d2).store(dqi.after(&[loop_j]).index(&d2).load() * scale);
    sink(&[sink(&[st_out.end(&[d2]), st_delta]).end(&[i])])
}

/// dK and dV of attention with recompute, one key row per THREAD iteration.
///
/// Buffers: 0 = Q, 1 = K, 2 = V, 3 = dO (each `n*d` f32), 4 = LSE (`n`, base 2), 5 = Delta
/// (`n`, from [`attention_backward_dq_ir`]); written: 6 = dK, 7 = dV (each `n*d`). Row `j`
/// walks every query `i`, recomputes `P_ij` and `dP_ij` as the dQ program does and
/// accumulates `dV_j += P_ij dO_i` and `dK_j += P_ij (dP_ij - Delta_i) q_i`.
#[must_use]
pub fn attention_backward_dkdv_ir(n: usize, d: usize) -> UOp {
    let f32t = DType::F32;
    let [q, k, v, dout] = [0, 1, 2, 3].map(|slot| buffer(slot, f32t, n * d));
    let (lse, delta) = (buffer(4, f32t, n), buffer(5, f32t, n));
    let (dk_out, dv_out) = (buffer(6, f32t, n * d), buffer(7, f32t, n * d));
    let mut pb = ProgramBuilder::new();
    let (dk, dv, s, dp) = (pb.alloc(f32t, d), pb.alloc(f32t, d), pb.alloc(f32t, 1), pb.alloc(f32t, 1));
    let scale2 = (1.0 / (d as f64).sqrt() * LOG2E) as f32;
    let scale = (1.0 / (d as f64).sqrt()) as f32;

    let j = pb.range(n, AxisType::Thread);
    let (dkj, dvj) = (dk.after(&[j.clone()]), dv.after(&[j.clone()]));
    let d0 = pb.range(d, AxisType::Loop);
    let init = sink(&[dkj.index(&d0).store(0.0f32), dvj.index(&d0).store(0.0f32)]).end(&[d0]);

    let i = pb.range(n, AxisType::Reduce);
    let (sv, dpv) = two_dots([&q, &k, &v, &dout], [&s, &dp], &i, &j, &[j.clone(), i.clone()], d, &mut pb);
    let p = (sv * scale2 - lse.index(&i).load()).exp2();
    let ds = &p * (dpv - delta.index(&i).load());
    let dd = pb.range(d, AxisType::Loop);
    let (dki, dvi) = (dkj.after(&[init.clone(), i.clone()]), dvj.after(&[init, i.clone()]));
    let st_k = dki.index(&dd).store(dki.index(&dd).load() + &ds * q.index(&i * d + &dd).load());
    let st_v = dvi.index(&dd).store(dvi.index(&dd).load() + &p * dout.index(&i * d + &dd).load());
    let loop_i = sink(&[st_k, st_v]).end(&[dd, i]);

    let d2 = pb.range(d, AxisType::Loop);
    let st_k = dk_out.index(&j * d + &d2).store(dkj.after(&[loop_i.clone()]).index(&d2).load() * scale);
    let st_v = dv_out.index(&j * d + &d2).store(dvj.after(&[loop_i]).index(&d2).load());
    sink(&[sink(&[st_k, st_v]).end(&[d2, j])])
}

/// The three recompute programs of one size: the forward with log-sum-exp and the two
/// backward programs.
#[must_use]
pub fn recompute_programs(n: usize, d: usize) -> [UOp; 3] {
    [online_attention_lse_ir(n, d), attention_backward_dq_ir(n, d), attention_backward_dkdv_ir(n, d)]
}

/// [`MemoryUse`] of the recompute backward, read from its two programs' BUFFERs and ALLOCs
/// (no compilation). Temporaries are what the backward holds besides Q, K, V, dO and the
/// gradients: O and LSE saved by the forward, Delta, and one thread's ALLOC scratch (every
/// thread has its own, so multiply by the thread count for a machine-wide figure).
pub fn recompute_memory(n: usize, d: usize) -> MemoryUse {
    let [_, dq, dkdv] = recompute_programs(n, d);
    let (dq_s, dkdv_s) = (program_storage(&dq), program_storage(&dkdv));
    // O (slot 3), LSE (5) and Delta (7) of the dQ program; Delta is shared with dK/dV.
    let temps: Vec<(UOp, usize)> = dq_s
        .iter()
        .filter(|(u, _)| matches!(u.op(), Op::Buffer { slot, .. } if matches!(slot.index(), 3 | 5 | 7)))
        .chain(dq_s.iter().chain(&dkdv_s).filter(|(u, _)| matches!(u.op(), Op::Alloc { .. })))
        .cloned()
        .collect();
    MemoryUse {
        temp_bytes: temps.iter().map(|(u, len)| u.dtype().size() * len).sum(),
        largest_temp: temps.iter().map(|t| t.1).max().unwrap_or(0),
        largest_any: largest_buffer(&dq).max(largest_buffer(&dkdv)),
    }
}

/// The compiled recompute programs for one `(n, d)`: compile once, run many times.
pub struct RecomputeBackward {
    n: usize,
    d: usize,
    /// [`online_attention_lse_ir`], compiled.
    pub forward: Program,
    /// [`attention_backward_dq_ir`], compiled.
    pub dq: Program,
    /// [`attention_backward_dkdv_ir`], compiled.
    pub dkdv: Program,
}

impl RecomputeBackward {
    /// Compiles the three programs for `(n, d)`.
    ///
    /// # Errors
    ///
    /// [`BackwardError::Jit`] when a program fails to compile.
    pub fn compile(n: usize, d: usize) -> Result<Self> {
        let [f, dq, dkdv] = recompute_programs(n, d);
        Ok(RecomputeBackward {
            n,
            d,
            forward: Program::compile(&f, "attention_fwd_lse")?,
            dq: Program::compile(&dq, "attention_bwd_dq")?,
            dkdv: Program::compile(&dkdv, "attention_bwd_dkdv")?,
        })
    }

    /// The forward pass: `(O, LSE)` for row-major `(n, d)` inputs.
    ///
    /// # Errors
    ///
    /// [`BackwardError::Shape`] when a slice does not have `n * d` elements;
    /// [`BackwardError::Jit`] when the run fails.
    pub fn forward(&self, q: &[f32], k: &[f32], v: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (n, d) = (self.n, self.d);
        for (name, x) in [("q", q), ("k", k), ("v", v)] {
            check_len(name, x, n, d)?;
        }
        let (mut o, mut lse) = (vec![0.0f32; n * d], vec![0.0f32; n]);
        self.forward.run_f32(&[q, k, v], &mut [&mut o, &mut lse])?;
        Ok((o, lse))
    }

    /// The backward pass from the forward's `O` and `LSE` and the incoming gradient `dout`.
    ///
    /// # Errors
    ///
    /// [`BackwardError::Shape`] when a slice does not have `n * d` elements (`lse`: `n`);
    /// [`BackwardError::Jit`] when a run fails.
    pub fn backward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &[f32],
        dout: &[f32],
        lse: &[f32],
    ) -> Result<AttentionGrads> {
        let (n, d) = (self.n, self.d);
        for (name, x) in [("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout)] {
            check_len(name, x, n, d)?;
        }
        check_len("lse", lse, n, 1)?;
        let (mut dq, mut delta) = (vec![0.0f32; n * d], vec![0.0f32; n]);
        self.dq.run_f32(&[q, k, v, o, dout, lse], &mut [&mut dq, &mut delta])?;
        let (mut dk, mut dv) = (vec![0.0f32; n * d], vec![0.0f32; n * d]);
        self.dkdv.run_f32(&[q, k, v, dout, lse, &delta], &mut [&mut dk, &mut dv])?;
        Ok(AttentionGrads { dq, dk, dv })
    }
}

/// The recompute backward end to end: compile, run the forward (saving O and LSE), then the
/// two backward programs. Inputs are row-major `(n, d)`.
///
/// # Errors
///
/// The errors of [`RecomputeBackward::compile`], [`RecomputeBackward::forward`] and
/// [`RecomputeBackward::backward`].
///
/// # Examples
///
/// The recompute backward agrees with autograd of the Tensor form:
///
/// ```rust
/// use uopc_kernels::backward::{backward_recompute, backward_unfused};
///
/// let (n, d) = (16, 8);
/// let x = |seed: usize| -> Vec<f32> {
///     (0..n * d).map(|i| ((i * 37 + seed) % 17) as f32 * 0.1 - 0.8).collect()
/// };
/// let (q, k, v, dout) = (x(1), x(2), x(3), x(4));
/// let fused = backward_recompute(&q, &k, &v, &dout, n, d)?;
/// let unfused = backward_unfused(&q, &k, &v, &dout, n, d)?;
/// let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4);
/// assert!(close(&fused.dq, &unfused.dq) && close(&fused.dk, &unfused.dk));
/// assert!(close(&fused.dv, &unfused.dv));
/// assert!(backward_recompute(&q, &k, &v, &dout[1..], n, d).is_err());
/// # Ok::<(), uopc_kernels::backward::BackwardError>(())
/// ```
pub fn backward_recompute(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    n: usize,
    d: usize,
) -> Result<AttentionGrads> {
    let r = RecomputeBackward::compile(n, d)?;
    let (o, lse) = r.forward(q, k, v)?;
    r.backward(q, k, v, &o, dout, &lse)
}
