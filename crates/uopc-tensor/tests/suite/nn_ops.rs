//! The float functions and normalizations (`tanh` ... `layer_norm`): values against f64
//! references (std's functions, musl's `erf` from the `libm` crate, host loops for the
//! reductions), behaviour at the extremes, 16-bit tensors, and gradients against central
//! finite differences in f64.

use crate::common::{check, rand64};
use ndarray::{ArrayD, IxDyn};
use uopc_tensor::{Tensor, TensorError};

fn vals64(t: &Tensor) -> Vec<f64> {
    t.to_ndarray::<f64>().expect("realizes").iter().copied().collect()
}
fn vals32(t: &Tensor) -> Vec<f32> {
    t.to_ndarray::<f32>().expect("realizes").iter().copied().collect()
}

/// Inputs from the extremes through the branch points of `tanh` (0.25) and `erf` (4, 6).
const GRID: [f64; 24] = [
    -1e4, -30.0, -6.5, -5.0, -4.0, -2.0, -1.0, -0.25, -0.1, -1e-3, -1e-7, 0.0, 1e-7, 1e-3, 0.1, 0.249, 0.25,
    0.7, 1.5, 3.9, 4.1, 5.9, 30.0, 1e4,
];

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}
fn gelu_tanh_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}
fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

type UnaryCase = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64);

const UNARY: [UnaryCase; 7] = [
    ("tanh", Tensor::tanh, f64::tanh),
    ("sigmoid", Tensor::sigmoid, sigmoid_ref),
    ("silu", Tensor::silu, |x| x * sigmoid_ref(x)),
    ("erf", Tensor::erf, libm::erf),
    ("gelu", Tensor::gelu, gelu_ref),
    ("gelu_tanh", Tensor::gelu_tanh, gelu_tanh_ref),
    ("abs", Tensor::abs, f64::abs),
];

#[test]
fn float_functions_match_f64_references_from_the_extremes_to_zero() {
    let x64 = Tensor::from_vec(GRID.to_vec(), &[GRID.len()]);
    let x32 = Tensor::from_vec(GRID.iter().map(|&v| v as f32).collect(), &[GRID.len()]);
    for (name, f, reference) in UNARY {
        let (got64, got32) = (vals64(&f(&x64)), vals32(&f(&x32)));
        for (k, &x) in GRID.iter().enumerate() {
            let want = reference(x);
            // f64: a few units of rounding, relative. f32: a few units relative, plus the
            // rounding of the exponent `x log2 e` to f32 inside `exp` (relative |x| 2^-24 ln 2
            // in the result), plus an absolute 2e-6 for erf's (and gelu's) f32 exponential.
            // gelu's `1 + erf(x / sqrt 2)` (and gelu_tanh's `1 + tanh`) cancels for negative x,
            // in torch too: an absolute error of a few units of 1 in the sum, times |x|.
            let gelu = name.starts_with("gelu");
            let (cancel, cancel32) = if gelu { (4e-16 * x.abs(), 2.4e-7 * x.abs()) } else { (0.0, 0.0) };
            let e64 = (got64[k] - want).abs();
            assert!(e64 <= 1e-14 * want.abs() + cancel + 1e-300, "{name}({x}) f64: {} vs {want}", got64[k]);
            let e32 = (got32[k] as f64 - want).abs();
            let tol32 = (1e-6 + 6e-8 * x.abs()) * want.abs()
                + cancel32
                + if name.contains("erf") || name == "gelu" { 2e-6 } else { 1e-30 };
            assert!(e32 <= tol32, "{name}({x}) f32: {} vs {want} (error {e32:e})", got32[k]);
        }
    }
}

#[test]
fn tanh_and_sigmoid_are_exact_at_the_extremes_and_never_nan() {
    let x = Tensor::from_vec(vec![-1e4f32, -30.0, 30.0, 1e4, f32::INFINITY, f32::NEG_INFINITY], &[6]);
    assert_eq!(vals32(&x.tanh()), [-1.0, -1.0, 1.0, 1.0, 1.0, -1.0]);
    let s = vals32(&x.sigmoid());
    assert_eq!((s[0], s[3], s[4], s[5]), (0.0, 1.0, 1.0, 0.0));
    assert!((s[1] as f64 - sigmoid_ref(-30.0)).abs() <= 3e-6 * sigmoid_ref(-30.0));
    // The gradients stay finite at the extremes too (no 0 * inf in an unused branch).
    let g = x.tanh().sum(0, false).gradient(&[&x]).unwrap();
    let g = vals32(&g[0]);
    assert!(
        g[0] == 0.0 && g[3] == 0.0 && g[1] > 0.0 && g[1] < 1e-25 && g.iter().all(|v| v.is_finite()),
        "{g:?}"
    );
    let g = x.sigmoid().sum(0, false).gradient(&[&x]).unwrap();
    assert!(vals32(&g[0]).iter().all(|v| v.is_finite()));
    let nan = Tensor::from_vec(vec![f32::NAN], &[1]);
    for (name, f, _) in UNARY {
        assert!(vals32(&f(&nan))[0].is_nan(), "{name}(NaN) is NaN");
    }
}

#[test]
fn pow_follows_torch_on_signs_zeros_and_integer_exponents() {
    let x = Tensor::from_vec(vec![-2.0f64, -2.0, 0.0, 0.0, f64::NAN, 2.0, 9.0, -8.0], &[8]);
    let y = Tensor::from_vec(vec![3.0f64, 0.5, 0.0, -1.0, 0.0, -1.0, 0.5, 2.0], &[8]);
    let p = vals64(&x.pow(&y));
    let want = [-8.0, f64::NAN, 1.0, f64::INFINITY, 1.0, 0.5, 3.0, 64.0];
    for (k, (&g, &w)) in p.iter().zip(&want).enumerate() {
        assert!(
            g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() < 1e-13 * w.abs(),
            "pow case {k}: {g} vs {w}"
        );
    }
    let x = Tensor::from_vec(vec![-1.5f64, 0.0, 2.0], &[3]);
    for p in [0.0, 1.0, 2.0, 3.0, 7.0, -2.0, 0.5, -0.5, 1.7, 16.0] {
        let got = vals64(&x.pow_scalar(p));
        for (k, &b) in [-1.5f64, 0.0, 2.0].iter().enumerate() {
            let w = b.powf(p);
            let same =
                got[k] == w || (got[k].is_nan() && w.is_nan()) || (got[k] - w).abs() <= 1e-14 * w.abs();
            assert!(same, "{b}^{p}: {} vs {w}", got[k]);
        }
    }
}

#[test]
fn minimum_min_and_clamp_match_their_definitions() {
    let a = rand64(&[4, 5], -3.0, 3.0, 7);
    let b = rand64(&[5], -3.0, 3.0, 8);
    let (ta, tb) = (Tensor::from_array(&a), Tensor::from_array(&b));
    let m = ta.minimum(&tb).to_ndarray::<f64>().unwrap();
    let want = ndarray::Zip::from(&a).and_broadcast(&b).map_collect(|&x, &y| x.min(y));
    assert_eq!(m, want);
    let rows = ta.min(1, false).to_ndarray::<f64>().unwrap();
    for (r, row) in a.outer_iter().enumerate() {
        assert_eq!(rows[r], row.iter().copied().fold(f64::INFINITY, f64::min));
    }
    let c = ta.clamp(Some(-1.0), Some(0.5)).to_ndarray::<f64>().unwrap();
    assert_eq!(c, a.mapv(|x| x.clamp(-1.0, 0.5)));
    assert_eq!(
        vals64(&ta.clamp(None, Some(0.0))),
        a.mapv(|x| x.min(0.0)).iter().copied().collect::<Vec<_>>()
    );
    // torch's order: the lower bound, then the upper, so min > max gives max.
    assert!(vals64(&ta.clamp(Some(2.0), Some(1.0))).iter().all(|&v| v == 1.0));
}

/// Host references of the row statistics, over the last axis of a 2-D array.
fn row_stats(a: &ArrayD<f64>) -> Vec<(f64, f64, f64)> {
    a.outer_iter()
        .map(|row| {
            let n = row.len() as f64;
            let mean = row.sum() / n;
            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            (mean, var, lse)
        })
        .collect()
}

#[test]
fn reductions_and_normalizations_match_f64_host_loops() {
    let a = rand64(&[6, 7], -4.0, 4.0, 11);
    let t = Tensor::from_array(&a);
    let stats = row_stats(&a);
    let (mean, var) = (vals64(&t.mean(-1, false)), vals64(&t.var(-1, 0, false)));
    let (unbiased, lse) = (vals64(&t.var(1, 1, true)), vals64(&t.logsumexp(-1, false)));
    let lsm = t.log_softmax(-1).to_ndarray::<f64>().unwrap();
    let ln = t.layer_norm(None, None, 1e-5).to_ndarray::<f64>().unwrap();
    for (r, &(m, v, l)) in stats.iter().enumerate() {
        assert!((mean[r] - m).abs() < 1e-15 && (var[r] - v).abs() < 1e-14, "row {r}");
        assert!((unbiased[r] - v * 7.0 / 6.0).abs() < 1e-14 && (lse[r] - l).abs() < 1e-14, "row {r}");
        for c in 0..7 {
            assert!((lsm[[r, c]] - (a[[r, c]] - l)).abs() < 1e-14, "log_softmax [{r}, {c}]");
            assert!(
                (ln[[r, c]] - (a[[r, c]] - m) / (v + 1e-5).sqrt()).abs() < 1e-13,
                "layer_norm [{r}, {c}]"
            );
        }
    }
    assert_eq!(t.var(1, 1, true).shape(), [6, 1]);
    let targets = [0, 6, 3, 3, 1, 2];
    let ce = vals64(&t.cross_entropy(&targets))[0];
    let want = -targets.iter().enumerate().map(|(r, &c)| a[[r, c]] - stats[r].2).sum::<f64>() / 6.0;
    assert!((ce - want).abs() < 1e-14, "cross_entropy {ce} vs {want}");
}

#[test]
fn logsumexp_and_log_softmax_do_not_overflow() {
    let x = Tensor::from_vec(vec![1e4f32, 1e4, -1e4, 88.0, 89.0, 90.0], &[2, 3]);
    let lse = vals32(&x.logsumexp(-1, false));
    assert!((lse[0] as f64 - (1e4 + 2f64.ln())).abs() < 1e-3, "{lse:?}");
    let want = 90.0 + (1.0 + (-1.0f64).exp() + (-2.0f64).exp()).ln();
    assert!((lse[1] as f64 - want).abs() < 1e-5, "{lse:?}");
    let lsm = vals32(&x.log_softmax(-1));
    assert!((lsm[2] as f64 + 2e4 + 2f64.ln()).abs() < 1e-2 && lsm.iter().all(|v| v.is_finite()), "{lsm:?}");
    // Rows of infinities: -inf gives -inf (not NaN), +inf gives +inf.
    let inf = Tensor::from_vec(vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, f32::INFINITY], &[2, 2]);
    assert_eq!(vals32(&inf.logsumexp(-1, false)), [f32::NEG_INFINITY, f32::INFINITY]);
    // A -inf logit off target leaves the cross-entropy finite.
    let logits = Tensor::from_vec(vec![0.0f32, f32::NEG_INFINITY], &[1, 2]);
    assert_eq!(vals32(&logits.cross_entropy(&[0])), [0.0]);
}

#[test]
fn sixteen_bit_tensors_compute_in_f32_and_round_once() {
    let a = rand64(&[3, 8], -3.0, 3.0, 5).mapv(|x| x as f32);
    let bf = Tensor::from_array(&a.mapv(half::bf16::from_f32));
    let f = Tensor::from_array(&a.mapv(|x| half::bf16::from_f32(x).to_f32()));
    let w = Tensor::from_vec(vec![half::bf16::from_f32(1.5); 8], &[8]);
    type Op = fn(&Tensor, &Tensor) -> Tensor;
    let ops: [(&str, Op); 6] = [
        ("tanh", |x, _| x.tanh()),
        ("gelu_tanh", |x, _| x.gelu_tanh()),
        ("erf", |x, _| x.erf()),
        ("logsumexp", |x, _| x.logsumexp(-1, true)),
        ("log_softmax", |x, _| x.log_softmax(-1)),
        ("layer_norm", |x, w| x.layer_norm(Some(w), None, 1e-5)),
    ];
    for (name, op) in ops {
        let half = op(&bf, &w);
        assert_eq!(half.dtype(), uopc_ir::DType::BF16, "{name} keeps the dtype");
        let got = half.to_ndarray::<half::bf16>().unwrap();
        let want =
            op(&f, &w.cast(uopc_ir::DType::F32)).to_ndarray::<f32>().unwrap().mapv(half::bf16::from_f32);
        assert_eq!(got, want, "{name}: the f32 result rounded once");
    }
}

#[test]
fn bad_arguments_are_errors_naming_the_op_and_argument() {
    let logits = Tensor::full(&[2, 3], 0.0);
    let msg = |e: TensorError| e.to_string();
    assert!(msg(logits.try_cross_entropy(&[0, 3]).unwrap_err()).contains("cross_entropy: targets[1] = 3"));
    assert!(msg(logits.try_cross_entropy(&[0]).unwrap_err()).contains("targets has 1 indices for 2 rows"));
    assert!(msg(Tensor::full(&[6], 0.0).try_cross_entropy(&[0]).unwrap_err()).contains("(.., C)"));
    let w = Tensor::full(&[2], 1.0);
    assert!(
        msg(logits.try_layer_norm(Some(&w), None, 1e-5).unwrap_err())
            .contains("layer_norm: weight has shape [2]")
    );
    assert!(msg(logits.try_layer_norm(None, Some(&w), 1e-5).unwrap_err()).contains("bias"));
    assert!(msg(logits.try_pow(&Tensor::full(&[2], 1.0)).unwrap_err()).starts_with("pow:"));
    assert!(msg(logits.try_mean(2, false).unwrap_err()).starts_with("mean:"));
    assert!(msg(logits.try_var(-3, 1, false).unwrap_err()).starts_with("var:"));
}

#[test]
fn gradients_of_the_float_functions() {
    // Away from the non-differentiable points (0 for abs, the bounds of clamp).
    let x = [ArrayD::from_shape_vec(
        IxDyn(&[2, 6]),
        vec![-3.0, -1.2, -0.3, -0.2, -0.05, 0.04, 0.1, 0.2, 0.3, 0.9, 2.5, 4.5],
    )
    .unwrap()];
    check("tanh", &x, |t| t[0].tanh());
    check("sigmoid", &x, |t| t[0].sigmoid());
    check("silu", &x, |t| t[0].silu());
    check("erf", &x, |t| t[0].erf());
    check("gelu", &x, |t| t[0].gelu());
    check("gelu_tanh", &x, |t| t[0].gelu_tanh());
    check("abs", &x, |t| t[0].abs());
    check("clamp", &x, |t| t[0].clamp(Some(-1.0), Some(1.0)));
    check("pow_scalar 3", &x, |t| t[0].pow_scalar(3.0));
    check("pow_scalar -2", &x, |t| t[0].pow_scalar(-2.0));
    let pos = [rand64(&[3, 4], 0.5, 2.0, 3), rand64(&[4], -1.5, 1.5, 4)];
    check("pow", &pos, |t| t[0].pow(&t[1]));
    check("pow_scalar 1.7", &pos, |t| t[0].pow_scalar(1.7));
    check("pow_scalar 0.5", &pos, |t| t[0].pow_scalar(0.5));
    check("minimum", &pos, |t| t[0].minimum(&t[1]));
}

#[test]
fn gradients_of_the_reductions_and_normalizations() {
    let x = [rand64(&[3, 5], -2.0, 2.0, 21)];
    check("min", &x, |t| t[0].min(1, false));
    check("mean", &x, |t| t[0].mean(0, true));
    check("var", &x, |t| t[0].var(-1, 1, false));
    check("logsumexp", &x, |t| t[0].logsumexp(-1, false));
    check("log_softmax", &x, |t| t[0].log_softmax(-1));
    check("cross_entropy", &x, |t| t[0].cross_entropy(&[4, 0, 2]));
    let ln = [rand64(&[3, 5], -2.0, 2.0, 22), rand64(&[5], 0.5, 1.5, 23), rand64(&[5], -1.0, 1.0, 24)];
    check("layer_norm", &ln, |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5));
}

#[test]
fn nan_propagates_through_max_min_relu_and_clamp_like_torch() {
    let nan = f32::NAN;
    let x = Tensor::from_vec(vec![nan, 1.0, 2.0], &[3]);
    assert!(vals32(&x.max(0, false))[0].is_nan(), "max([NaN, 1, 2]) = NaN");
    assert!(vals32(&x.min(0, false))[0].is_nan(), "min([NaN, 1, 2]) = NaN");
    let r = vals32(&x.relu());
    assert!(r[0].is_nan() && r[1..] == [1.0, 2.0], "relu: {r:?}");
    let c = vals32(&x.clamp(Some(1.5), Some(1.8)));
    assert!(c[0].is_nan() && c[1..] == [1.5, 1.8], "clamp: {c:?}");
    let y = Tensor::from_vec(vec![0.0f32, nan, 5.0], &[3]);
    let (mx, mn) = (vals32(&x.maximum(&y)), vals32(&x.minimum(&y)));
    assert!(mx[0].is_nan() && mx[1].is_nan() && mx[2] == 5.0, "maximum: {mx:?}");
    assert!(mn[0].is_nan() && mn[1].is_nan() && mn[2] == 2.0, "minimum: {mn:?}");
    // Long rows take the vectorized reduction: a NaN in its body, in its tail, or in no row.
    let (rows, cols) = (4, 67);
    let mut v: Vec<f32> = (0..rows * cols).map(|k| ((k * 13) % 29) as f32).collect();
    v[5] = nan;
    v[cols + 66] = nan;
    v[2 * cols + 33] = nan;
    let m = vals32(&Tensor::from_vec(v, &[rows, cols]).max(1, false));
    assert!(m[0].is_nan() && m[1].is_nan() && m[2].is_nan() && m[3] == 28.0, "row maxima: {m:?}");
}

#[test]
fn a_row_sum_over_a_broadcast_softmax_realizes_fused_for_any_row_count() {
    // softmax over rows of one element, broadcast along a row of `a` and summed with it: fused,
    // the softmax's rows are THREAD tasks on tile ops and the row sum accumulates inside each
    // task; with one row the task loop has one iteration and no index names it.
    use uopc_tensor::RealizeOptions;
    for (rows, cols) in [(1, 2), (1, 5), (2, 3), (3, 1)] {
        let (x, a) = (rand64(&[rows, 1], -2.0, 2.0, 70), rand64(&[rows, cols], -1.0, 1.0, 71));
        // f32 inputs (the tile ops read f32 rows; a widening cast would keep the loop form)
        let f32s = |v: &ArrayD<f64>| Tensor::from_array(&v.mapv(|e| e as f32));
        let y = (f32s(&a) + f32s(&x).softmax(-1)).sum(-1, false);
        // each softmax is exp(0) / exp(0) = 1
        let want: Vec<f64> = (0..rows).map(|r| (0..cols).map(|c| a[[r, c]] + 1.0).sum()).collect();
        for opts in [RealizeOptions::default(), RealizeOptions::fused()] {
            let fused = opts.fuse_reduce;
            let got =
                y.to_ndarray_with::<f32>(&opts).unwrap_or_else(|e| panic!("({rows}, {cols}) {fused}: {e}"));
            assert_eq!(got.shape(), [rows]);
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "({rows}, {cols}) fused={fused}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn erf_gradients_are_the_closed_form_to_second_order() {
    // erf's value is a series; its gradient rule is 2/sqrt(pi) e^(-x^2), whose own gradient is
    // -2x times it: both compared with those formulas in f64, past the series' bound (6) too.
    let xs = vec![-7.0, -3.0, -0.7, 0.0, 0.3, 1.5, 5.9, 6.5];
    let x = Tensor::from_vec(xs.clone(), &[xs.len()]);
    let y = x.erf().sum(0, false);
    let [dx] = &y.gradient(&[&x]).unwrap()[..] else { unreachable!() };
    let [ddx] = &dx.sum(0, false).gradient(&[&x]).unwrap()[..] else { unreachable!() };
    let slope = |x: f64| std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp();
    for ((&x, g), h) in xs.iter().zip(vals64(dx)).zip(vals64(ddx)) {
        // e^(-x^2) carries the rounding of x^2 scaled by x^2, and the exponential's own.
        let tol = 4.0 * f64::EPSILON * (1.0 + x * x);
        assert!((g - slope(x)).abs() <= tol * slope(x), "erf'({x}) = {g}");
        let want = -2.0 * x * slope(x);
        assert!((h - want).abs() <= 2.0 * tol * want.abs(), "erf''({x}) = {h}, want {want}");
    }
}

#[test]
fn tanh_and_sigmoid_gradients_are_the_closed_forms_into_the_tails() {
    // sigmoid' = e/(1+e)^2 and tanh' = 4e/(1+e)^2 (e = exp(-|x|), exp(-2|x|)): compared with
    // the f64 formulas relatively, where s (1 - s) and 1 - tanh^2 would have cancelled to 0.
    let xs: Vec<f64> = vec![-60.0, -30.0, -8.0, -0.2, 0.0, 0.1, 0.3, 5.0, 17.0, 40.0];
    fn sigmoid_slope(x: f64) -> f64 {
        let e = (-x.abs()).exp();
        e / ((1.0 + e) * (1.0 + e))
    }
    fn tanh_slope(x: f64) -> f64 {
        4.0 * sigmoid_slope(2.0 * x)
    }
    type Case = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64);
    let cases: [Case; 2] = [("sigmoid", Tensor::sigmoid, sigmoid_slope), ("tanh", Tensor::tanh, tanh_slope)];
    for (name, f, slope) in cases {
        let x = Tensor::from_vec(xs.clone(), &[xs.len()]);
        let [dx] = &f(&x).sum(0, false).gradient(&[&x]).unwrap()[..] else { unreachable!() };
        for (&x, g) in xs.iter().zip(vals64(dx)) {
            // The exponential's rounding of its argument, scaled by |x|, and a few units more.
            let tol = 8.0 * f64::EPSILON * (1.0 + 2.0 * x.abs());
            assert!((g - slope(x)).abs() <= tol * slope(x), "{name}'({x}) = {g}, want {}", slope(x));
        }
        let x32 = Tensor::from_vec(xs.iter().map(|&v| v as f32).collect(), &[xs.len()]);
        let [dx] = &f(&x32).sum(0, false).gradient(&[&x32]).unwrap()[..] else { unreachable!() };
        for (&x, g) in xs.iter().zip(vals32(dx)) {
            // f32's exponential: a few units of 2^-24 plus the rounding of its argument.
            let tol = 1e-6 + 1.2e-7 * x.abs();
            let want = slope(x);
            // Below f32's smallest normal the slope is flushed or subnormal: absolute there.
            let ok = (f64::from(g) - want).abs() <= tol * want + 1e-37;
            assert!(ok, "f32 {name}'({x}) = {g}, want {want}");
        }
    }
    // The backward of gelu_tanh (x sigmoid(2u)) is the forward plus the closed form's and the
    // product rule's few nodes, not the derivative of sigmoid's sign split and exponential.
    let x = Tensor::from_vec(vec![0.5f32; 8], &[8]);
    let forward = graph_nodes(&x.gelu_tanh());
    let [dx] = &x.gelu_tanh().sum(0, false).gradient(&[&x]).unwrap()[..] else { unreachable!() };
    let backward = graph_nodes(dx);
    assert!(backward < forward + 25, "gelu_tanh: backward {backward} nodes for a forward of {forward}");
}

#[test]
fn gelu_backward_does_not_differentiate_the_erf_series() {
    // The backward graph of exact GELU is its forward plus the few nodes of erf's closed-form
    // derivative and GELU's product rule, not the series differentiated term by term (which
    // doubled it: each of erf's 45 f32 terms adds its own products and sums).
    let x = Tensor::from_vec(vec![0.5f32; 8], &[8]);
    let forward = graph_nodes(&x.gelu());
    let [dx] = &x.gelu().sum(0, false).gradient(&[&x]).unwrap()[..] else { unreachable!() };
    let backward = graph_nodes(dx);
    eprintln!("gelu graph nodes: forward {forward}, backward {backward}");
    assert!(backward < forward + 40, "backward {backward} nodes for a forward of {forward}");
}

/// Nodes of a tensor's graph.
fn graph_nodes(t: &Tensor) -> usize {
    uopc_ir::UOp::toposort(std::slice::from_ref(t.uop())).len()
}

#[test]
fn f32_erf_is_within_three_ulps_of_the_f64_reference() {
    // Densely over both branches and their joint at 1, and past the saturation at 4: f32's
    // polynomial near 0 and fitted erfc beyond, against musl's f64 erf. The error budget: the
    // fit's 3e-8 relative in erfc, the rounding of x^2 and of the exponential, the final
    // `1 - erfc` (one ulp of the result).
    let xs: Vec<f32> = (0..=18_000).map(|i| -4.5 + i as f32 * 5e-4).collect();
    let got = vals32(&Tensor::from_vec(xs.clone(), &[xs.len()]).erf());
    for (&x, &y) in xs.iter().zip(&got) {
        let want = libm::erf(x as f64);
        let err = (y as f64 - want).abs();
        assert!(err <= 2e-7 * want.abs().max(1e-3) + 1e-12, "erf({x}) = {y}, want {want} (error {err:e})");
    }
}

#[test]
fn cross_entropy_of_n_d_logits_and_tensor_targets_is_the_rows_loss() {
    // (batch, tokens, classes) logits: every (batch, token) is a row, in row-major order;
    // the loss and its gradient are those of the (batch * tokens, classes) matrix.
    let logits = Tensor::randn(&[2, 3, 7], 11);
    let rows = logits.reshape(&[6, 7]);
    let targets = [0usize, 6, 3, 1, 1, 5];
    let by_tensor =
        logits.try_cross_entropy_tensor(&Tensor::from_vec(vec![0i32, 6, 3, 1, 1, 5], &[2, 3])).unwrap();
    let by_rows = rows.try_cross_entropy(&targets).unwrap();
    assert_eq!(by_tensor.item().unwrap(), by_rows.item().unwrap());
    let grad = |loss: &Tensor| uopc_tensor::gradient(loss, &[&logits]).unwrap().remove(0);
    let (g, h) = (grad(&by_tensor).to_ndarray::<f32>().unwrap(), grad(&by_rows).to_ndarray::<f32>().unwrap());
    assert_eq!(g.as_slice().unwrap(), h.as_slice().unwrap());
    // Targets of the wrong shape, a negative index, or a float dtype are errors naming the op.
    let bad = [
        Tensor::from_vec(vec![0i64; 6], &[6]),
        Tensor::from_vec(vec![0i64, -1, 0, 0, 0, 0], &[2, 3]),
        Tensor::from_vec(vec![0.0f32; 6], &[2, 3]),
    ];
    for t in &bad {
        let err = logits.try_cross_entropy_tensor(t).unwrap_err();
        assert!(err.to_string().starts_with("cross_entropy"), "{err}");
    }
}
