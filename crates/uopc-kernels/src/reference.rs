//! The f64 reference every attention kernel is checked against: a plain two-pass softmax per
//! query row, in f64 so that its own rounding is far below the kernels' f32 error.

use crate::masked::{AttentionShape, PadData};

/// `softmax(q k^T / sqrt(d)) v` for one head: `q`, `k`, `v` are `n * d` f32, row-major.
///
/// # Panics
///
/// If a slice is shorter than `n * d`.
pub fn attention_f64(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
    masked_attention_reference(&AttentionShape::single(n, n, d), q, k, v, false, PadData::None)
}

/// [`attention_f64`] under a causal mask: row `i` sees keys `0..=i`.
///
/// # Panics
///
/// If a slice is shorter than `n * d`.
pub fn causal_attention_f64(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
    masked_attention_reference(&AttentionShape::single(n, n, d), q, k, v, true, PadData::None)
}

/// Batched multi-head attention in f64 (shapes as in [`AttentionShape`]): each query row
/// attends the keys its masks allow (`causal`: `j <= i + causal_offset()`; `pad` as in
/// [`PadData`]); a row with no key allowed is zeros, as the masked kernels define it.
///
/// # Panics
///
/// If `q` is shorter than [`AttentionShape::q_len`], `k` or `v` shorter than
/// [`AttentionShape::kv_len`], or the padding data shorter than `batch` key lengths or
/// [`AttentionShape::mask_len`] mask elements.
pub fn masked_attention_reference(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    causal: bool,
    pad: PadData<'_>,
) -> Vec<f64> {
    let AttentionShape { batch, heads, n_q, n_k, d } = *shape;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; shape.q_len()];
    let mut scores: Vec<(usize, f64)> = Vec::with_capacity(n_k);
    for b in 0..batch {
        let attends = |i: usize, j: usize| {
            let visible = !causal || (j as i64) <= i as i64 + shape.causal_offset();
            visible
                && match pad {
                    PadData::None => true,
                    PadData::KeyLengths(l) => (j as i64) < i64::from(l[b]),
                    PadData::Mask(m) => m[(b * n_q + i) * n_k + j],
                }
        };
        for h in 0..heads {
            let bh = b * heads + h;
            for i in 0..n_q {
                let qi = &q[(bh * n_q + i) * d..][..d];
                scores.clear();
                scores.extend((0..n_k).filter(|&j| attends(i, j)).map(|j| {
                    let kj = &k[(bh * n_k + j) * d..][..d];
                    (j, qi.iter().zip(kj).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * scale)
                }));
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let row = &mut out[(bh * n_q + i) * d..][..d];
                let mut l = 0.0;
                for &(j, s) in &scores {
                    let p = (s - m).exp();
                    l += p;
                    for (o, &x) in row.iter_mut().zip(&v[(bh * n_k + j) * d..][..d]) {
                        *o += p * f64::from(x);
                    }
                }
                if l > 0.0 {
                    row.iter_mut().for_each(|o| *o /= l);
                }
            }
        }
    }
    out
}

/// Largest `|got - want|`; a NaN anywhere, or lengths that differ, count as infinitely wrong
/// (so a kernel that leaves output unwritten or mis-sized never passes a tolerance).
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

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32).map(|x| ((x.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    #[test]
    fn one_key_returns_its_value() {
        let (q, k, v) = (values(3, 1), values(3, 2), values(3, 3));
        let out = attention_f64(&q, &k, &v, 1, 3);
        for (o, x) in out.iter().zip(&v) {
            assert!((o - f64::from(*x)).abs() < 1e-12);
        }
    }

    #[test]
    fn rows_are_convex_combinations_of_values() {
        let (n, d) = (16, 4);
        let (q, k, v) = (values(n * d, 1), values(n * d, 2), values(n * d, 3));
        for out in [attention_f64(&q, &k, &v, n, d), causal_attention_f64(&q, &k, &v, n, d)] {
            for c in 0..d {
                let col = (0..n).map(|j| f64::from(v[j * d + c]));
                let (lo, hi) = col.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
                assert!((0..n).all(|i| (lo - 1e-12..=hi + 1e-12).contains(&out[i * d + c])));
            }
        }
    }

    #[test]
    fn the_first_causal_row_is_the_first_value_row() {
        let (n, d) = (5, 2);
        let (q, k, v) = (values(n * d, 1), values(n * d, 2), values(n * d, 3));
        let out = causal_attention_f64(&q, &k, &v, n, d);
        assert!((out[0] - f64::from(v[0])).abs() < 1e-12 && (out[1] - f64::from(v[1])).abs() < 1e-12);
    }

    #[test]
    fn a_row_with_every_key_masked_is_zeros() {
        let s = AttentionShape::single(2, 3, 2);
        let (q, k, v) = (values(4, 1), values(6, 2), values(6, 3));
        let lens = [0i32];
        let out = masked_attention_reference(&s, &q, &k, &v, false, PadData::KeyLengths(&lens));
        assert!(out.iter().all(|x| *x == 0.0));
    }

    #[test]
    fn nan_and_length_mismatch_are_errors() {
        assert_eq!(max_abs_err(&[f32::NAN], &[0.0]), f64::INFINITY);
        assert_eq!(max_abs_err(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(max_abs_err(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
    }
}
