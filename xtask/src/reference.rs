//! Deterministic inputs and the f64 reference every measured form is checked against.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    let mut fill = |scale: f32| (0..n * d).map(|_| rng.gen_range(-scale..scale)).collect::<Vec<f32>>();
    let q = fill(2.0);
    let k = fill(2.0);
    let v = fill(1.0);
    Inputs { q, k, v }
}

/// `softmax(q k^T / sqrt(d)) v` in f64 with plain loops (a two-pass softmax per row).
pub fn attention_f64(x: &Inputs, n: usize, d: usize) -> Vec<f64> {
    attention_f64_with(x, n, d, false)
}

/// [`attention_f64`], causal (row `i` sees keys `0..=i`) when `causal`.
pub fn attention_f64_with(x: &Inputs, n: usize, d: usize, causal: bool) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; n * d];
    let mut row = vec![0.0f64; n];
    for i in 0..n {
        let s = &mut row[..if causal { i + 1 } else { n }];
        let qi = &x.q[i * d..(i + 1) * d];
        for (j, sj) in s.iter_mut().enumerate() {
            let kj = &x.k[j * d..(j + 1) * d];
            *sj = qi.iter().zip(kj).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * scale;
        }
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut l = 0.0;
        for sj in s.iter_mut() {
            *sj = (*sj - m).exp();
            l += *sj;
        }
        let oi = &mut out[i * d..(i + 1) * d];
        for (j, &p) in s.iter().enumerate() {
            for (o, &vv) in oi.iter_mut().zip(&x.v[j * d..(j + 1) * d]) {
                *o += p * f64::from(vv);
            }
        }
        oi.iter_mut().for_each(|o| *o /= l);
    }
    out
}

/// Largest `|got - want|`; NaN anywhere counts as infinitely wrong.
pub fn max_abs_err(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (f64::from(g) - w).abs();
            if e.is_nan() { f64::INFINITY } else { e }
        })
        .fold(0.0, f64::max)
}

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

    #[test]
    fn one_key_returns_its_value() {
        let x = inputs(1, 3);
        let out = attention_f64(&x, 1, 3);
        for (o, v) in out.iter().zip(&x.v) {
            assert!((o - f64::from(*v)).abs() < 1e-12);
        }
    }

    #[test]
    fn rows_are_convex_combinations_of_values() {
        let (n, d) = (16, 4);
        let x = inputs(n, d);
        let out = attention_f64(&x, n, d);
        for c in 0..d {
            let col = (0..n).map(|j| f64::from(x.v[j * d + c]));
            let (lo, hi) = col.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
            assert!((0..n).all(|i| (lo..=hi).contains(&out[i * d + c])));
        }
    }

    #[test]
    fn nan_is_an_error() {
        assert_eq!(max_abs_err(&[f32::NAN], &[0.0]), f64::INFINITY);
        assert_eq!(max_abs_err(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
    }
}
