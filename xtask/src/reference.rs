//! Deterministic inputs, and the f64 reference every measured form is checked against (the
//! kernels crate's, applied to them).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::kernels::reference;

/// Q, K and V of one attention head, each `n * d` f32, row-major.
pub struct Inputs {
    /// Queries.
    pub q: Vec<f32>,
    /// Keys.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
}

/// Pseudo-random inputs, the same for the same `(n, d)` on every run.
///
/// Q and K are uniform in [-2, 2) so that scores spread over a few units and the softmax is
/// far from uniform (a missing rescale of the running output would show); V is in [-1, 1).
pub fn inputs(n: usize, d: usize) -> Inputs {
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ((n as u64) << 32) ^ d as u64);
    let mut fill = |scale: f32| (0..n * d).map(|_| rng.random_range(-scale..scale)).collect::<Vec<f32>>();
    let q = fill(2.0);
    let k = fill(2.0);
    let v = fill(1.0);
    Inputs { q, k, v }
}

/// `softmax(q k^T / sqrt(d)) v` of `x` in f64 (the kernels crate's reference).
pub fn attention_f64(x: &Inputs, n: usize, d: usize) -> Vec<f64> {
    reference::attention_f64(&x.q, &x.k, &x.v, n, d)
}

/// [`attention_f64`], causal (row `i` sees keys `0..=i`) when `causal`.
pub fn attention_f64_with(x: &Inputs, n: usize, d: usize, causal: bool) -> Vec<f64> {
    if causal { reference::causal_attention_f64(&x.q, &x.k, &x.v, n, d) } else { attention_f64(x, n, d) }
}

pub use reference::max_abs_err;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic() {
        let (a, b) = (inputs(8, 4), inputs(8, 4));
        assert_eq!(a.q, b.q);
        assert_eq!(a.v, b.v);
        assert_ne!(a.q, a.k);
    }
}
