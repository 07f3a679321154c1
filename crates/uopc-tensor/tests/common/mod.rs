//! Shared helpers: seeded random arrays and tolerance checks against f64 references.
#![allow(dead_code)]

use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Uniform values in `[lo, hi)`, seeded.
pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> ArrayD<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|_| rng.random_range(lo..hi)).collect()).unwrap()
}

/// Standard normal values (Box-Muller), seeded.
pub fn normal(shape: &[usize], seed: u64) -> ArrayD<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let v = (0..n)
        .map(|_| {
            let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random_range(0.0..1.0));
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

pub fn f64s(a: &ArrayD<f32>) -> ArrayD<f64> {
    a.mapv(|x| x as f64)
}

/// Largest `|got - want| / (1 + |want|)`, after checking the shapes agree.
pub fn rel_err(got: &ArrayD<f32>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape(), "shapes differ");
    got.iter().zip(want.iter()).map(|(&g, &w)| (g as f64 - w).abs() / (1.0 + w.abs())).fold(0.0, f64::max)
}

/// Largest `|got - want|`.
pub fn abs_err(got: &ArrayD<f32>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape(), "shapes differ");
    got.iter().zip(want.iter()).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max)
}

/// Asserts agreement to `tol` relative to `1 + |want|`.
#[track_caller]
pub fn assert_close(got: &ArrayD<f32>, want: &ArrayD<f64>, tol: f64) {
    let e = rel_err(got, want);
    assert!(e <= tol, "error {e:e} > {tol:e}\ngot  {got:?}\nwant {want:?}");
}
