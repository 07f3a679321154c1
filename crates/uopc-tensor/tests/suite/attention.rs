//! Unfused and fused attention against an f64 reference written with plain loops.
//!
//! Tolerance 1e-5 absolute (the bar). Inputs are standard normal, so outputs are
//! convex combinations of values of size ~1; the f32 error is a few roundings of the
//! 64-term dot products and the N-term sums (~1e-7 each, relative), far below 1e-5.

use crate::common::*;
use ndarray::{ArrayD, IxDyn};
use uopc_tensor::attention::attention;
use uopc_tensor::*;

fn reference(q: &ArrayD<f32>, k: &ArrayD<f32>, v: &ArrayD<f32>) -> ArrayD<f64> {
    let (n, d) = (q.shape()[0], q.shape()[1]);
    let (q, k, v) = (q.as_slice().unwrap(), k.as_slice().unwrap(), v.as_slice().unwrap());
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; n * d];
    let mut s = vec![0.0f64; n];
    for i in 0..n {
        for j in 0..n {
            s[j] = (0..d).map(|e| q[i * d + e] as f64 * k[j * d + e] as f64).sum::<f64>() * scale;
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut l = 0.0;
        for x in s.iter_mut() {
            *x = (*x - m).exp();
            l += *x;
        }
        for j in 0..n {
            for e in 0..d {
                out[i * d + e] += s[j] * v[j * d + e] as f64 / l;
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[n, d]), out).unwrap()
}

fn check(n: usize, d: usize) {
    let (q, k, v) = (normal(&[n, d], 1 + n as u64), normal(&[n, d], 2 + d as u64), normal(&[n, d], 3));
    let want = reference(&q, &k, &v);
    let o = attention(&Tensor::from_array(&q), &Tensor::from_array(&k), &Tensor::from_array(&v));
    let unfused = o.to_ndarray::<f32>().unwrap();
    let fused = o.to_ndarray_with::<f32>(&RealizeOptions::fused()).unwrap();
    let (eu, ef) = (abs_err(&unfused, &want), abs_err(&fused, &want));
    assert!(eu <= 1e-5, "unfused N={n} D={d}: max abs error {eu:e}");
    assert!(ef <= 1e-5, "fused N={n} D={d}: max abs error {ef:e}");
}

#[test]
fn attention_small_sizes() {
    for n in [1, 7, 33] {
        for d in [1, 64] {
            check(n, d);
        }
    }
}

#[cfg(feature = "jit")]
#[test]
fn attention_n512() {
    check(512, 1);
    check(512, 64);
}

#[cfg(feature = "jit")]
#[test]
fn attention_n1024() {
    check(1024, 1);
    check(1024, 64);
}

#[test]
fn fused_plan_has_no_n_by_n_buffer_at_any_size() {
    for (n, d) in [(7, 1), (7, 64), (64, 64)] {
        let (q, k, v) = (normal(&[n, d], 1), normal(&[n, d], 2), normal(&[n, d], 3));
        let o = attention(&Tensor::from_array(&q), &Tensor::from_array(&k), &Tensor::from_array(&v));
        let plan = make_plan(&[o.uop().clone()], &RealizeOptions::fused()).unwrap();
        assert!(plan.temp_sizes().iter().all(|&t| t <= n * d), "N={n} D={d}: {plan}");
    }
}

#[test]
fn the_one_liner_batches_leading_axes() {
    // (2, 3, n, d): every (batch, head) slice against the 2-D reference.
    let (n, d) = (9, 8);
    let (q, k, v) = (normal(&[2, 3, n, d], 7), normal(&[2, 3, n, d], 8), normal(&[2, 3, n, d], 9));
    let o = attention(&Tensor::from_array(&q), &Tensor::from_array(&k), &Tensor::from_array(&v));
    let got = o.to_ndarray::<f32>().unwrap();
    assert_eq!(got.shape(), &[2, 3, n, d]);
    let slice = |x: &ArrayD<f32>, b: usize, h: usize| {
        let s = x.index_axis(ndarray::Axis(0), b).index_axis(ndarray::Axis(0), h).to_owned();
        s.into_dyn()
    };
    for b in 0..2 {
        for h in 0..3 {
            let want = reference(&slice(&q, b, h), &slice(&k, b, h), &slice(&v, b, h));
            let e = abs_err(&slice(&got, b, h), &want);
            assert!(e <= 1e-5, "slice ({b}, {h}): {e:e}");
        }
    }
}
