//! Attention as one Tensor expression, realized unfused or fully fused.

use crate::error::{Result, shape_err};
use crate::tensor::Tensor;

/// `softmax(q k^T / sqrt(D)) v` for `q`: `(.., Nq, D)`, `k`: `(.., N, D)` and `v`:
/// `(.., N, Dv)`, leading axes (batch, heads) batched and equal.
///
/// This is attention as the compiler sees a tensor expression: realize it with default
/// [`RealizeOptions`](crate::RealizeOptions) for the unfused plan (six kernels for matrices,
/// the scores materialized) or with [`RealizeOptions::fused`](crate::RealizeOptions::fused)
/// for the fully fused one. The hand-written FlashAttention-2 kernel as a graph node is
/// `uopc_kernels::sdpa::scaled_dot_product_attention`.
///
/// # Errors
///
/// A [`TensorError::Shape`](crate::TensorError::Shape) naming `attention` and the three
/// shapes when they are not of those shapes.
pub fn try_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (sq, sk, sv) = (q.shape(), k.shape(), v.shape());
    if sq.len() > 2 && sk.len() == sq.len() && sv.len() == sq.len() {
        return crate::masked::try_attention_masked(q, k, v, None, false).map_err(|e| e.in_op("attention"));
    }
    if sq.len() != 2 || sk.len() != 2 || sv.len() != 2 || sq[1] != sk[1] || sk[0] != sv[0] {
        return Err(shape_err(
            "attention",
            format!("q {sq:?}, k {sk:?}, v {sv:?} are not (Nq, D), (N, D), (N, Dv)"),
        ));
    }
    let d = sq[1] as f32;
    let attend = || -> Result<Tensor> {
        let scores = q.try_matmul(&k.try_transpose(0, 1)?)? * (1.0 / d.sqrt());
        scores.try_softmax(-1)?.try_matmul(v)
    };
    attend().map_err(|e| e.in_op("attention"))
}

/// [`try_attention`], panicking on shapes that do not fit.
///
/// ```rust
/// use uopc_tensor::{RealizeOptions, Tensor, attention::attention};
/// let t = |s: usize| Tensor::from_vec((0..16 * 8).map(|i| ((i * s) % 7) as f32 / 7.0).collect(), &[16, 8]);
/// let out = attention(&t(1), &t(2), &t(3));
/// let (unfused, fused) = (out.to_ndarray::<f32>()?, out.realize_with(&RealizeOptions::fused())?.0);
/// let diff = (&unfused - &fused.to_ndarray::<f32>()?).mapv(f32::abs);
/// assert!(diff.iter().all(|&d| d < 1e-5)); // one function, two plans, the same values
/// # Ok::<(), uopc_tensor::TensorError>(())
/// ```
///
/// # Panics
///
/// Where [`try_attention`] returns an error.
#[track_caller]
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    match try_attention(q, k, v) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

/// The query rows each THREAD iteration of an attention kernel owns: the largest divisor of the
/// query count `n` that is at most `want`.
pub use crate::util::largest_divisor_at_most as query_block;
