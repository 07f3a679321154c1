//! Masked, batched attention as one Tensor expression, realized unfused or fully fused.

use crate::error::{Result, shape_err};
use crate::tensor::Tensor;
use uopc_ir::DType;

/// The score a masked key gets before the softmax. Finite on purpose: with `-inf`, a row whose
/// keys are all masked would compute `-inf - (-inf) = NaN` when the row max is subtracted.
const MASKED_SCORE: f32 = -1.0e30;

/// The `(n_q, n_k)` causal mask as 0/1 floats: query `i` sees keys `j <= i + n_k - n_q`
/// (queries aligned to the end of the keys).
pub fn causal_mask(n_q: usize, n_k: usize) -> Tensor {
    // Positions, not data: the fused kernel reads the mask's bound off the comparison and skips
    // the key blocks past the diagonal.
    let off = Tensor::from_uop(uopc_ir::const_of(n_k as f64 - n_q as f64, DType::I64));
    let rows = &Tensor::arange(n_q).reshape(&[n_q, 1]) + &off;
    let keys = Tensor::arange(n_k).reshape(&[1, n_k]);
    keys.le(&rows).cast(DType::F32)
}

/// Whether numpy broadcasting stretches `from` to exactly `to`.
fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == t || f == 1)
}

/// `a @ b^T` over the last two axes, leading axes batched: `(.., n, k)` x `(.., m, k)` ->
/// `(.., n, m)`, as broadcast-multiply-reduce over the contiguous last axis.
fn batched_matmul_t(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (sa, sb) = (a.shape(), b.shape());
    let r = sa.len();
    if r < 2 || sb.len() != r || sa[..r - 2] != sb[..r - 2] || sa[r - 1] != sb[r - 1] {
        return Err(shape_err("attention_masked", format!("cannot multiply {sa:?} by {sb:?} transposed")));
    }
    let (n, m, k) = (sa[r - 2], sb[r - 2], sa[r - 1]);
    let lead = &sa[..r - 2];
    let shape = |x: &[usize]| -> Vec<usize> { lead.iter().chain(x).copied().collect() };
    let x = a.try_reshape(&shape(&[n, 1, k]))?.try_expand(&shape(&[n, m, k]))?;
    let y = b.try_reshape(&shape(&[1, m, k]))?.try_expand(&shape(&[n, m, k]))?;
    x.try_mul(&y)?.try_sum(-1, false)
}

/// [`attention_masked`], returning shape errors instead of panicking.
///
/// # Errors
///
/// A [`TensorError::Shape`](crate::TensorError::Shape) naming `attention_masked` when `q`,
/// `k` and `v` are not `(.., n, d)` tensors of one rank with matching batch axes, keys and
/// head size, or when `mask` does not broadcast to the scores' shape.
pub fn try_attention_masked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Result<Tensor> {
    masked_attention_graph(q, k, v, mask, causal).map_err(|e| e.in_op("attention_masked"))
}

fn masked_attention_graph(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Result<Tensor> {
    let r = q.ndim();
    if r < 2 || k.ndim() != r || v.ndim() != r {
        return Err(shape_err(
            "attention_masked",
            format!("q {:?}, k {:?}, v {:?} must be (.., n, d) of one rank", q.shape(), k.shape(), v.shape()),
        ));
    }
    let (n_q, n_k, d) = (q.shape()[r - 2], k.shape()[r - 2], q.shape()[r - 1]);
    let scores = batched_matmul_t(q, k)? * (1.0 / (d as f32).sqrt());
    let mut keep: Option<Tensor> = None;
    if let Some(m) = mask.filter(|m| !broadcasts_to(m.shape(), scores.shape())) {
        return Err(shape_err(
            "attention_masked",
            format!("mask {:?} does not broadcast to the scores' shape {:?}", m.shape(), scores.shape()),
        ));
    }
    if let Some(m) = mask {
        // nonzero = attend; broadcast to the scores' shape so the row test below sees all keys
        keep = Some(
            m.try_ne(&Tensor::full(&[], 0.0))?.cast(uopc_ir::DType::F32).try_broadcast_to(scores.shape())?,
        );
    }
    if causal {
        let c = causal_mask(n_q, n_k);
        keep = Some(match keep {
            Some(kp) => kp.try_mul(&c)?,
            None => c.try_broadcast_to(scores.shape())?,
        });
    }
    let Some(keep) = keep else {
        return batched_matmul_t(&scores.try_softmax(-1)?, &v.try_transpose(-2, -1)?);
    };
    if mask.is_none() && n_q <= n_k {
        // Causal alone, every query sees key 0: no row is fully masked, so masked scores can be
        // -inf (adding exactly nothing, which lets the fused kernel skip the blocks past the
        // diagonal) and no row needs zeroing.
        let masked = keep
            .try_ne(&Tensor::full(&[], 0.0))?
            .try_where(&scores, &Tensor::full(&[], f32::NEG_INFINITY))?;
        return batched_matmul_t(&masked.try_softmax(-1)?, &v.try_transpose(-2, -1)?);
    }
    let masked =
        keep.try_ne(&Tensor::full(&[], 0.0))?.try_where(&scores, &Tensor::full(&[], MASKED_SCORE))?;
    // A fully masked row has uniform weights over MASKED_SCORE; the indicator "this row
    // attends some key" zeroes it, so its output is 0 rather than the mean of V.
    let any_key = keep.try_max(-1, true)?;
    let p = masked.try_softmax(-1)?.try_mul(&any_key)?;
    batched_matmul_t(&p, &v.try_transpose(-2, -1)?)
}

/// `softmax(q k^T / sqrt(d) masked) v` for `q`: `(.., n_q, d)`, `k`: `(.., n_k, d)`, `v`:
/// `(.., n_k, dv)` (leading axes such as batch and heads are batched).
///
/// `mask` broadcasts to `(.., n_q, n_k)`; nonzero entries are attended. `causal` lets query `i`
/// attend keys `j <= i + n_k - n_q` only. A query row with no attended key produces zeros.
/// Realize with default options for the unfused plan (scores materialized) or with
/// [`RealizeOptions::fused`](crate::RealizeOptions::fused) for the fused one.
///
/// ```rust
/// use uopc_tensor::{Tensor, masked::attention_masked};
/// let x = Tensor::from_vec((0..2 * 4 * 8).map(|i| (i % 5) as f32 / 5.0).collect(), &[2, 4, 8]);
/// let out = attention_masked(&x, &x, &x, None, true).to_ndarray::<f32>()?;
/// assert_eq!(out.shape(), [2, 4, 8]);
/// // the first query of each batch sees only the first key: its output is that key's value
/// assert!((0..8).all(|c| (out[[0, 0, c]] - (c % 5) as f32 / 5.0).abs() < 1e-6));
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Panics
///
/// Where [`try_attention_masked`] returns an error.
#[track_caller]
pub fn attention_masked(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, causal: bool) -> Tensor {
    match try_attention_masked(q, k, v, mask, causal) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}
