//! The two tile ops composed the way attention uses them: S = Q K^T, the softmax update, then
//! O += P V, block by block, must equal softmax(Q K^T / sqrt(D)) V computed in f64.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{GemmShape, SoftmaxShape, gemm, softmax_update};

#[test]
fn blocked_attention_matches_reference() {
    let mut rng = StdRng::seed_from_u64(21);
    // (queries, keys, head dim, key block): ragged last blocks included.
    for (nq, nk, d, bk) in [(64, 256, 64, 64), (37, 150, 40, 64), (5, 9, 3, 4)] {
        let q: Vec<f32> = (0..nq * d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let k: Vec<f32> = (0..nk * d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let v: Vec<f32> = (0..nk * d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
        // Fold the log2-domain scale into Q once, as the caller of the kernels does.
        let qs: Vec<f32> = q.iter().map(|x| x * scale).collect();
        for isa in common::isas() {
            let mut o = vec![0.0f32; nq * d];
            let (mut row_max, mut row_sum) = (vec![f32::NEG_INFINITY; nq], vec![0.0f32; nq]);
            for k0 in (0..nk).step_by(bk) {
                let kb = bk.min(nk - k0);
                let mut s = vec![0.0f32; nq * kb];
                let qk = GemmShape::dense(nq, kb, d, false, true, false);
                gemm(isa, &qk, &qs, &k[k0 * d..(k0 + kb) * d], &mut s).unwrap();
                let sh = SoftmaxShape::dense(nq, kb, d);
                softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
                let pv = GemmShape::dense(nq, d, kb, false, false, true);
                gemm(isa, &pv, &s, &v[k0 * d..(k0 + kb) * d], &mut o).unwrap();
            }
            for i in 0..nq {
                let logits: Vec<f64> = (0..nk)
                    .map(|j| {
                        (0..d).map(|c| f64::from(q[i * d + c]) * f64::from(k[j * d + c])).sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for c in 0..d {
                    let exact: f64 = (0..nk).map(|j| w[j] * f64::from(v[j * d + c])).sum::<f64>() / z;
                    let got = f64::from(o[i * d + c]) / f64::from(row_sum[i]);
                    // Outputs are convex combinations of values in [-1, 1]; f32 storage of P and
                    // the scaled scores bounds the error well below 1e-5.
                    assert!(
                        (got - exact).abs() <= 1e-5,
                        "{isa} nq={nq} nk={nk} d={d}: O[{i},{c}] = {got}, expected {exact}"
                    );
                }
            }
        }
    }
}
