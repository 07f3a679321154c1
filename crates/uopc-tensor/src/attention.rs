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

/// The largest divisor of `n` that is at most `want` (at least 1): a block size that tiles `n`
/// exactly, such as the query rows each THREAD iteration owns.
pub fn query_block(n: usize, want: usize) -> usize {
    (1..=want.max(1)).rev().find(|b| n.is_multiple_of(*b)).unwrap_or(1)
}
