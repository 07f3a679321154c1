//! Attention as one Tensor expression, realized unfused or fully fused.

use crate::tensor::Tensor;

/// `softmax(q k^T / sqrt(D)) v` for `q`, `k`: `(N, D)` and `v`: `(N, Dv)`.
///
/// Realize it with default [`RealizeOptions`](crate::RealizeOptions) for the unfused plan
/// (six kernels, the scores materialized) or with
/// [`RealizeOptions::fused`](crate::RealizeOptions::fused) for the fully fused one.
#[track_caller]
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    let d = *q.shape().last().expect("q has a head dimension") as f32;
    (q.matmul(&k.t()) * (1.0 / d.sqrt())).softmax(-1).matmul(v)
}

/// The query rows each THREAD iteration of an attention kernel owns: the largest divisor of the
/// query count `n` that is at most `want`.
pub use crate::util::largest_divisor_at_most as query_block;
