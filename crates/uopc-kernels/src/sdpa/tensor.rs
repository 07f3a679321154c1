//! Attention on lazy tensors: [`scaled_dot_product_attention`] puts the FlashAttention-2
//! kernel into a tensor graph as one kernel node.

use super::blocking::cores;
use super::graph_backward::{backward_nodes, half_backward_nodes, saved_parts};
use super::in_place::{in_place_node, read_in_place};
use super::kernel::{sdpa_ir_output_last, sdpa_ir_output_last_with_lse};
use super::{Blocking, MaskKind, SdpaConfig, SdpaDType, SdpaError};
use std::sync::Arc;
use uopc_ir::DType;
use uopc_tensor::{CustomVjp, Tensor, TensorError};

/// The score a masked key gets in the gradient's reference graph: finite, so a fully masked
/// row computes `exp(0)` over finite values instead of `-inf - (-inf)`, and its indicator
/// then zeroes it.
const MASKED_SCORE: f32 = -1.0e30;

/// `softmax(scale * q k^T + bias, masked) v` on lazy tensors, computed by the same
/// FlashAttention-2 kernel as [`super::Sdpa`], as one kernel node of the graph (planned,
/// cached and run like the kernels the compiler cuts; its inputs are materialized first if
/// they are computed).
///
/// q is `(.., H, n_q, D)`, k and v `(.., H_kv, n_k, D)` with `H % H_kv == 0` (grouped-query
/// heads read their key/value head in place); rank 2 means one head, and axes before the
/// heads are batch axes, which must match. `mask` broadcasts to `(.., H, n_q, n_k)`: a bool
/// tensor (`true` = attend) or an f32 additive bias (`-inf` masks a key). `causal` aligns
/// queries to the end of the keys (query `i` sees keys `j <= i + n_k - n_q`); `scale` is
/// `1 / sqrt(D)` when `None`. Rows that see no key give zeros. The output has q's shape and
/// dtype: q, k and v are all f32, all bf16 or all f16 (see [`SdpaDType`]; a 16-bit node's
/// gradient is the f32 backward of its widened inputs, rounded to its dtype, as
/// [`super::SdpaBackwardHalf`] computes it).
///
/// The gradient (through [`uopc_tensor::gradient`]) runs the FlashAttention-2 backward of
/// [`super::SdpaBackward`] as kernel nodes: `Delta`, then one kernel for dq, dk and dv (no
/// `n_q x n_k` buffer), reading the forward's output and the rows' log-sum-exp, which an f32
/// node writes beside its output (a 16-bit node's gradient runs the f32 forward again on the
/// widened inputs). An f32 bias gets its gradient
/// (`dS`, summed over its broadcast axes) from a kernel node of its own, which recomputes the
/// scores: a gradient rule cannot tell whether the bias's gradient is wanted, and as a node of
/// its own it runs only when it is. A bool mask gets none. A 16-bit node keeps the unfused
/// graph over the same inputs as its equivalent (a reference). The decode shapes that
/// [`super::Sdpa`] splits over the keys (split-K) run unsplit here.
///
/// # Errors
///
/// [`SdpaError::Shape`] naming the argument whose shape or dtype does not fit; the errors of
/// [`SdpaConfig::validate`].
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f32>,
) -> Result<Tensor, SdpaError> {
    let mut config = config_of(q, k, v, causal, scale)?;
    let sq = q.shape();
    if let Some(m) = mask {
        config.mask = mask_kind(m, &config, sq)?;
    }
    config.validate()?;
    // A graph's kernel node reads k and v as the graph holds them (no packing pass).
    let blocking = Blocking { splits: 1, kv_panel_width: 0, ..Blocking::choose(&config, cores()) };
    let mut sources = vec![q, k, v];
    sources.extend(mask);
    if config.dtype == SdpaDType::F32 {
        if let Some(placed) = read_in_place(&config, [q, k, v]) {
            return in_place_node(&config, &blocking, placed, [q, k, v], mask, None).map_err(shape_fault);
        }
        // The node also writes the rows' log-sum-exp: its gradient reads the forward's output
        // and lse instead of running the forward again.
        let (q_len, rows) = (config.q_len(), config.batch * config.heads * config.n_q);
        let program = sdpa_ir_output_last_with_lse(&config, &blocking, None);
        let node = Tensor::try_custom_parts("sdpa_flash_tile_ops", program, &sources, &[q_len, rows], None)
            .map_err(shape_fault)?;
        let rule: Arc<CustomVjp> = Arc::new(move |src: &[Tensor], out: &Tensor, g: &Tensor| {
            let saved = saved_parts(out, &config)?;
            backward_nodes(&config, &blocking, src, &g.try_slice(0, 0, q_len)?, Some(saved))
        });
        let node = node.with_custom_vjp(rule).map_err(shape_fault)?;
        return node.try_slice(0, 0, q_len).and_then(|o| o.try_reshape(sq)).map_err(shape_fault);
    }
    // The reference graph of 16-bit inputs runs in f32 and rounds its result once, as the
    // kernel does.
    let wide = |t: &Tensor| t.cast(DType::F32);
    let equivalent = unfused(&wide(q), &wide(k), &wide(v), mask, &config)
        .map(|o| o.cast(q.dtype()))
        .map_err(shape_fault)?;
    if let Some(placed) = read_in_place(&config, [q, k, v]) {
        return in_place_node(&config, &blocking, placed, [q, k, v], mask, Some(&equivalent))
            .map_err(shape_fault);
    }
    let program = sdpa_ir_output_last(&config, &blocking, None);
    let node = Tensor::try_custom("sdpa_flash_tile_ops", program, &sources, sq, q.dtype(), Some(equivalent))
        .map_err(shape_fault)?;
    let rule: Arc<CustomVjp> =
        Arc::new(move |src: &[Tensor], _out: &Tensor, d_o: &Tensor| half_backward_nodes(&config, src, d_o));
    node.with_custom_vjp(rule).map_err(shape_fault)
}

/// The configuration of attention of `q` over `k` and `v` (unvalidated, without a mask): the
/// shapes and dtypes [`scaled_dot_product_attention`] takes, each fault naming its argument.
pub(super) fn config_of(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f32>,
) -> Result<SdpaConfig, SdpaError> {
    let shape_err = |arg: &'static str, msg: String| SdpaError::Shape { arg, msg };
    let dtype = match q.dtype() {
        DType::F32 => SdpaDType::F32,
        DType::BF16 => SdpaDType::BF16,
        DType::F16 => SdpaDType::F16,
        other => return Err(shape_err("q", format!("is {other}; attention takes f32, bf16 or f16"))),
    };
    for (arg, t) in [("q", q), ("k", k), ("v", v)] {
        if t.dtype() != q.dtype() {
            return Err(shape_err(
                arg,
                format!("is {}, q is {}: q, k and v must have one dtype", t.dtype(), q.dtype()),
            ));
        }
        if t.ndim() < 2 {
            return Err(shape_err(arg, format!("{:?} is not (.., n, d)", t.shape())));
        }
    }
    let (sq, sk) = (q.shape(), k.shape());
    if k.shape() != v.shape() {
        return Err(shape_err("v", format!("{:?} differs from k's {sk:?}", v.shape())));
    }
    let r = sq.len();
    if sk.len() != r {
        return Err(shape_err("k", format!("{sk:?} has another rank than q's {sq:?}")));
    }
    let head_axis = |s: &[usize]| if r >= 3 { s[r - 3] } else { 1 };
    let lead = r.saturating_sub(3);
    if sq[..lead] != sk[..lead] {
        return Err(shape_err("k", format!("batch axes of {sk:?} differ from q's {sq:?}")));
    }
    if sq[r - 1] != sk[r - 1] {
        return Err(shape_err("k", format!("head size {} differs from q's {}", sk[r - 1], sq[r - 1])));
    }
    let batch: usize = sq[..lead].iter().product();
    let (heads, kv_heads) = (head_axis(sq), head_axis(sk));
    let (n_q, n_k, d) = (sq[r - 2], sk[r - 2], sq[r - 1]);
    Ok(SdpaConfig { kv_heads, causal, scale, dtype, ..SdpaConfig::new(batch, heads, n_q, n_k, d) })
}

/// A tensor error of building an attention's nodes, as the error of the call.
pub(super) fn shape_fault(e: TensorError) -> SdpaError {
    SdpaError::Shape { arg: "q", msg: e.to_string() }
}

/// The mask kind of `m` against q's shape `sq`: its shape, padded with leading 1s, must have
/// 1 or the full size on every axis, and its batch axes must be all 1 or all full.
fn mask_kind(m: &Tensor, config: &SdpaConfig, sq: &[usize]) -> Result<MaskKind, SdpaError> {
    let r = sq.len();
    let full: Vec<usize> = sq[..r - 1].iter().copied().chain([config.n_k]).collect();
    let err = |msg: String| SdpaError::Shape { arg: "mask", msg };
    if m.ndim() > r {
        return Err(err(format!("{:?} has more axes than the scores {full:?}", m.shape())));
    }
    let padded: Vec<usize> = std::iter::repeat_n(1, r - m.ndim()).chain(m.shape().iter().copied()).collect();
    if padded.iter().zip(&full).any(|(&a, &f)| a != 1 && a != f) {
        return Err(err(format!("{:?} does not broadcast to the scores {full:?}", m.shape())));
    }
    let lead = r.saturating_sub(3);
    let batch_axes = &padded[..lead];
    let b = if batch_axes.iter().all(|&x| x == 1) {
        1
    } else if batch_axes == &full[..lead] {
        config.batch
    } else {
        return Err(err(format!("{:?}: its batch axes must all be 1 or all full", m.shape())));
    };
    let h = if r >= 3 { padded[r - 3] } else { 1 };
    let shape = [b, h, padded[r - 2], padded[r - 1]];
    match m.dtype() {
        DType::Bool => Ok(MaskKind::Bool(shape)),
        DType::F32 => Ok(MaskKind::Bias(shape)),
        other => Err(err(format!("is {other}; a mask is bool (attend) or an f32 bias"))),
    }
}

/// The same attention as ordinary tensor ops on `(B, H, n, D)` views (the scores
/// materialized): what autograd differentiates.
fn unfused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    c: &SdpaConfig,
) -> Result<Tensor, TensorError> {
    let SdpaConfig { batch: b, heads: h, kv_heads: hkv, n_q, n_k, d, .. } = *c;
    let g = h / hkv;
    let q4 = q.try_reshape(&[b, h, n_q, d])?;
    // Key/value head `h / g` serves query head `h`.
    let per_head = |x: &Tensor| -> Result<Tensor, TensorError> {
        x.try_reshape(&[b, hkv, 1, n_k, d])?.try_expand(&[b, hkv, g, n_k, d])?.try_reshape(&[b, h, n_k, d])
    };
    let (k4, v4) = (per_head(k)?, per_head(v)?);
    let scores = q4
        .try_reshape(&[b, h, n_q, 1, d])?
        .try_expand(&[b, h, n_q, n_k, d])?
        .try_mul(&k4.try_reshape(&[b, h, 1, n_k, d])?.try_expand(&[b, h, n_q, n_k, d])?)?
        .try_sum(-1, false)?
        .try_mul(&Tensor::full(&[], c.effective_scale()))?;
    let full = [b, h, n_q, n_k];
    let mut scores = scores;
    let mut keep: Option<Tensor> = None;
    let both = |a: Option<Tensor>, x: Tensor| -> Result<Tensor, TensorError> {
        match a {
            Some(a) => a.try_mul(&x),
            None => Ok(x),
        }
    };
    if let (Some(m), MaskKind::Bool(s) | MaskKind::Bias(s)) = (mask, c.mask) {
        let m4 = m.try_reshape(&s)?.try_broadcast_to(&full)?;
        if m.dtype() == DType::Bool {
            keep = Some(m4.cast(DType::F32));
        } else {
            keep = Some(m4.try_ne(&Tensor::full(&[], f32::NEG_INFINITY))?.cast(DType::F32));
            let finite = keep.as_ref().expect("set above").try_ne(&Tensor::full(&[], 0.0))?;
            scores = scores.try_add(&finite.try_where(&m4, &Tensor::full(&[], 0.0))?)?;
        }
    }
    if c.causal {
        keep = Some(both(keep, uopc_tensor::masked::causal_mask(n_q, n_k).try_broadcast_to(&full)?)?);
    }
    let p = match keep {
        None => scores.try_softmax(-1)?,
        Some(keep) => {
            let seen = keep.try_ne(&Tensor::full(&[], 0.0))?;
            let masked = seen.try_where(&scores, &Tensor::full(&[], MASKED_SCORE))?;
            // A row that sees no key has uniform weights over MASKED_SCORE; zero it.
            masked.try_softmax(-1)?.try_mul(&keep.try_max(-1, true)?)?
        }
    };
    let out = p
        .try_reshape(&[b, h, n_q, n_k, 1])?
        .try_expand(&[b, h, n_q, n_k, d])?
        .try_mul(&v4.try_reshape(&[b, h, 1, n_k, d])?.try_expand(&[b, h, n_q, n_k, d])?)?
        .try_sum(-2, false)?;
    out.try_reshape(q.shape())
}
