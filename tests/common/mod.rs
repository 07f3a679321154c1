//! References shared by the attention test files (each uses a subset).
#![allow(dead_code)]

/// softmax(Q K^T / sqrt(D)) V in f64 with plain loops.
pub fn attention_f64(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; n * d];
    let scale = 1.0 / (d as f64).sqrt();
    for i in 0..n {
        let s: Vec<f64> = (0..n)
            .map(|j| (0..d).map(|e| q[i * d + e] as f64 * k[j * d + e] as f64).sum::<f64>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for j in 0..n {
            for e in 0..d {
                out[i * d + e] += p[j] / l * v[j * d + e] as f64;
            }
        }
    }
    out
}

/// Largest `|a - b|`.
pub fn max_abs_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}
