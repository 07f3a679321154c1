//! Shared helpers: seeded random arrays and tolerance checks against f64 references.
#![allow(dead_code)]

use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc_ir::DType;
use uopc_tensor::{RealizeOptions, Tensor, gradient, realize};

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

// Gradients against central finite differences, all in f64: `grad_err` compares
// `gradient(sum(f(x..) * w))` (fixed random weights `w`, so every output element gets its own
// cotangent) with `(loss(x + h) - loss(x - h)) / 2h`. With h = 1e-5 the truncation error is
// about h^2 |f'''| ~ 1e-9 and the rounding error about 1e-16 / h ~ 1e-11, so a tolerance of
// 1e-6 relative to 1 + |gradient| is loose for correct rules and far below any wrong term.

pub const H: f64 = 1e-5;
pub const TOL: f64 = 1e-6;

/// [`uniform`] as f64.
pub fn rand64(shape: &[usize], lo: f32, hi: f32, seed: u64) -> ArrayD<f64> {
    uniform(shape, lo, hi, seed).mapv(|x| x as f64)
}

/// The one element of a realized tensor, as f64.
pub fn scalar_of(t: &Tensor) -> f64 {
    *t.to_ndarray::<f64>().expect("loss realizes").iter().next().expect("one element")
}

/// Largest finite-difference error of `gradient` over every element of every input.
pub fn grad_err(inputs: &[ArrayD<f64>], f: &dyn Fn(&[Tensor]) -> Tensor) -> f64 {
    let tensors = |ins: &[ArrayD<f64>]| -> Vec<Tensor> { ins.iter().map(Tensor::from_array).collect() };
    let ts = tensors(inputs);
    let out = f(&ts);
    assert_eq!(out.dtype(), DType::F64, "the check runs in f64");
    let w = rand64(out.shape(), -1.0, 1.0, 99);
    let loss_of = |ts: &[Tensor]| {
        let o = f(ts);
        (o * Tensor::from_array(&w)).reshape(&[w.len()]).sum(0, false)
    };
    let loss = loss_of(&ts);
    let refs: Vec<&Tensor> = ts.iter().collect();
    let grads = gradient(&loss, &refs).expect("gradient builds");
    let (got, _) = realize(&grads.iter().collect::<Vec<_>>(), &RealizeOptions::default()).expect("realizes");
    let mut worst: f64 = 0.0;
    for (k, a) in inputs.iter().enumerate() {
        let g = got[k].to_ndarray::<f64>().expect("f64 gradient");
        assert_eq!(g.shape(), a.shape(), "gradient {k} has the parameter's shape");
        for (e, &ge) in g.iter().enumerate() {
            let eval = |delta: f64| {
                let mut ins = inputs.to_vec();
                ins[k].as_slice_mut().expect("standard layout")[e] += delta;
                scalar_of(&loss_of(&tensors(&ins)))
            };
            let num = (eval(H) - eval(-H)) / (2.0 * H);
            worst = worst.max((ge - num).abs() / (1.0 + num.abs()));
        }
    }
    worst
}

/// Asserts the finite-difference error of `f`'s gradient is within [`TOL`].
#[track_caller]
pub fn check(name: &str, inputs: &[ArrayD<f64>], f: impl Fn(&[Tensor]) -> Tensor) {
    let err = grad_err(inputs, &f);
    eprintln!("{name}: max finite-difference error {err:.1e}");
    assert!(err <= TOL, "{name}: finite-difference error {err:e}");
}
