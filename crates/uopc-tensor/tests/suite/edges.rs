//! Edges of the input space: hostile shapes given to every `try_` method (an error or a
//! result, never a panic), numerics at the limits of f32 (torch's values are the reference),
//! long sums, and the smaller semantic rows (the derivative of `abs` at 0, gradients of
//! non-scalar outputs, `exp` in the subnormal range).

use std::panic::{AssertUnwindSafe, catch_unwind};
use uopc_ir::DType;
use uopc_tensor::masked::try_attention_masked;
use uopc_tensor::{Result, Tensor, attention::try_attention, gradient, ndarray};

const HUGE: usize = usize::MAX;
const I64_MAX: usize = i64::MAX as usize;

/// Shapes no caller should be able to turn into a panic: empty, zero-sized, and axes at and
/// past every limit (the element cap, `i64::MAX`, `usize::MAX`), alone and beside a 0.
fn hostile_shapes() -> Vec<Vec<usize>> {
    vec![
        vec![],
        vec![0],
        vec![1],
        vec![2, 3],
        vec![1, 0, 1],
        vec![0, HUGE],
        vec![HUGE, 0],
        vec![0, I64_MAX],
        vec![0, 1 << 41],
        vec![1 << 40, 1 << 40, 0],
        vec![HUGE],
        vec![I64_MAX],
        vec![1 << 41],
        vec![1 << 20, 1 << 21],
        vec![HUGE, HUGE],
    ]
}

const HOSTILE_AXES: [isize; 7] = [0, 1, -1, -2, 5, isize::MAX, isize::MIN];

/// Runs `f`, realizing a small `Ok` result too (a large one is only built: realizing it is
/// an allocation, not a shape question), and returns a description of the panic if any.
fn probe(name: &str, f: impl FnOnce() -> Result<Tensor>) -> Option<String> {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if let Ok(t) = f()
            && t.numel() <= 1 << 16
        {
            let _ = t.to_ndarray::<f32>();
        }
    }));
    r.err().map(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{name}: {msg}")
    })
}

#[test]
fn every_try_method_returns_ok_or_err_on_hostile_shapes_and_never_panics() {
    let mut panics = Vec::new();
    let mut check = |name: String, f: &dyn Fn() -> Result<Tensor>| {
        if let Some(p) = probe(&name, f) {
            panics.push(p);
        }
    };
    // Tensors of every hostile shape the constructors and reshape accept.
    let mut bases: Vec<Tensor> =
        vec![Tensor::scalar(1.0), Tensor::full(&[2, 3], 1.0), Tensor::full(&[0, 3], 1.0)];
    for s in hostile_shapes() {
        check(format!("try_full({s:?})"), &|| Tensor::try_full(&s, 1.0));
        check(format!("try_full_dtype({s:?})"), &|| Tensor::try_full_dtype(&s, 1, DType::I64));
        check(format!("try_from_vec({s:?})"), &|| Tensor::try_from_vec(Vec::<f32>::new(), &s));
        check(format!("try_from_vec(1, {s:?})"), &|| Tensor::try_from_vec(vec![1.0f32], &s));
        check(format!("try_one_hot([0, 1], {})", s.first().copied().unwrap_or(0)), &|| {
            Tensor::try_one_hot(&[0, 1], s.first().copied().unwrap_or(0))
        });
        check(format!("try_one_hot([], {})", s.first().copied().unwrap_or(0)), &|| {
            Tensor::try_one_hot(&[], s.first().copied().unwrap_or(0))
        });
        if let Ok(t) = Tensor::try_full(&s, 1.0) {
            bases.push(t);
        }
        if let Ok(t) = Tensor::full(&[0], 1.0).try_reshape(&s) {
            bases.push(t);
        }
        if let Ok(t) = Tensor::full(&vec![1; s.len()], 1.0).try_expand(&s) {
            bases.push(t);
        }
    }
    let e = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[0, 3]));
    check("try_from_array([0, 3])".into(), &|| Tensor::try_from_array(&e));
    let small = Tensor::full(&[2, 3], 1.0);
    for x in &bases {
        let sx = x.shape().to_vec();
        for s in hostile_shapes() {
            check(format!("{sx:?}.try_reshape({s:?})"), &|| x.try_reshape(&s));
            check(format!("{sx:?}.try_expand({s:?})"), &|| x.try_expand(&s));
            check(format!("{sx:?}.try_broadcast_to({s:?})"), &|| x.try_broadcast_to(&s));
            let bounds: Vec<(usize, usize)> = s.iter().map(|&n| (n / 2, n)).collect();
            check(format!("{sx:?}.try_shrink({bounds:?})"), &|| x.try_shrink(&bounds));
            check(format!("{sx:?}.try_permute({s:?})"), &|| x.try_permute(&s));
            if let Ok(y) = Tensor::try_full(&s, 2.0).or_else(|_| Tensor::full(&[0], 1.0).try_reshape(&s)) {
                let sy = y.shape().to_vec();
                check(format!("{sx:?}.try_add({sy:?})"), &|| x.try_add(&y));
                check(format!("{sx:?}.try_sub({sy:?})"), &|| x.try_sub(&y));
                check(format!("{sx:?}.try_mul({sy:?})"), &|| x.try_mul(&y));
                check(format!("{sx:?}.try_div({sy:?})"), &|| x.try_div(&y));
                check(format!("{sx:?}.try_maximum({sy:?})"), &|| x.try_maximum(&y));
                check(format!("{sx:?}.try_minimum({sy:?})"), &|| x.try_minimum(&y));
                check(format!("{sx:?}.try_pow({sy:?})"), &|| x.try_pow(&y));
                check(format!("{sx:?}.try_lt({sy:?})"), &|| x.try_lt(&y));
                check(format!("{sx:?}.try_gt({sy:?})"), &|| x.try_gt(&y));
                check(format!("{sx:?}.try_le({sy:?})"), &|| x.try_le(&y));
                check(format!("{sx:?}.try_ge({sy:?})"), &|| x.try_ge(&y));
                check(format!("{sx:?}.try_eq({sy:?})"), &|| x.try_eq(&y));
                check(format!("{sx:?}.try_ne({sy:?})"), &|| x.try_ne(&y));
                check(format!("{sx:?}.try_where({sy:?})"), &|| x.try_gt(&y)?.try_where(x, &y));
                check(format!("{sx:?}.try_matmul({sy:?})"), &|| x.try_matmul(&y));
                check(format!("{sy:?}.try_matmul({sx:?})"), &|| y.try_matmul(x));
                check(format!("try_cat([{sx:?}, {sy:?}])"), &|| Tensor::try_cat(&[x, &y], 0));
                check(format!("try_stack([{sx:?}, {sy:?}])"), &|| Tensor::try_stack(&[x, &y], 0));
                check(format!("try_attention({sx:?}, {sy:?}, {sy:?})"), &|| try_attention(x, &y, &y));
                check(format!("try_attention_masked({sx:?}, {sy:?})"), &|| {
                    try_attention_masked(x, &y, &y, Some(&y), true)
                });
                let idx = y.cast(DType::I64);
                check(format!("{sx:?}.try_index_select(0, {sy:?})"), &|| x.try_index_select(0, &idx));
                check(format!("{sx:?}.try_gather(0, {sy:?})"), &|| x.try_gather(0, &idx));
            }
        }
        for a in HOSTILE_AXES {
            for keep in [false, true] {
                check(format!("{sx:?}.try_sum({a}, {keep})"), &|| x.try_sum(a, keep));
                check(format!("{sx:?}.try_max({a}, {keep})"), &|| x.try_max(a, keep));
                check(format!("{sx:?}.try_min({a}, {keep})"), &|| x.try_min(a, keep));
                check(format!("{sx:?}.try_mean({a}, {keep})"), &|| x.try_mean(a, keep));
                check(format!("{sx:?}.try_var({a}, 1, {keep})"), &|| x.try_var(a, 1, keep));
                check(format!("{sx:?}.try_var({a}, MAX, {keep})"), &|| x.try_var(a, usize::MAX, keep));
                check(format!("{sx:?}.try_logsumexp({a}, {keep})"), &|| x.try_logsumexp(a, keep));
            }
            check(format!("{sx:?}.try_softmax({a})"), &|| x.try_softmax(a));
            check(format!("{sx:?}.try_log_softmax({a})"), &|| x.try_log_softmax(a));
            check(format!("{sx:?}.try_transpose({a}, 0)"), &|| x.try_transpose(a, 0));
            check(format!("{sx:?}.try_transpose(0, -1).try_softmax({a})"), &|| {
                x.try_transpose(0, -1)?.try_softmax(a)
            });
            for (b, e) in [(0, 0), (0, 1), (1, 0), (0, HUGE), (HUGE, HUGE)] {
                check(format!("{sx:?}.try_slice({a}, {b}, {e})"), &|| x.try_slice(a, b, e));
            }
            check(format!("try_stack([{sx:?}], {a})"), &|| Tensor::try_stack(&[x], a));
            check(format!("try_cat([{sx:?}, {sx:?}], {a})"), &|| Tensor::try_cat(&[x, x], a));
            let idx = Tensor::from_vec(vec![0i64, 1], &[2]);
            check(format!("{sx:?}.try_index_select({a}, [0, 1])"), &|| x.try_index_select(a, &idx));
            check(format!("{sx:?}.try_gather({a}, [0, 1])"), &|| x.try_gather(a, &idx));
        }
        for targets in [&[][..], &[0], &[0, 1], &[HUGE]] {
            check(format!("{sx:?}.try_cross_entropy({targets:?})"), &|| x.try_cross_entropy(targets));
        }
        for rows in [&[][..], &[0], &[HUGE]] {
            check(format!("{sx:?}.try_index_select_rows({rows:?})"), &|| x.try_index_select_rows(rows));
        }
        let last = Tensor::full(&sx[sx.len().saturating_sub(1)..], 1.0);
        check(format!("{sx:?}.try_layer_norm"), &|| x.try_layer_norm(None, None, 1e-5));
        check(format!("{sx:?}.try_layer_norm(w, b)"), &|| x.try_layer_norm(Some(&last), Some(&last), 1e-5));
        check(format!("{sx:?}.try_layer_norm(small)"), &|| x.try_layer_norm(Some(&small), None, 1e-5));
        check(format!("{sx:?}.try_add(small)"), &|| x.try_add(&small));
        check(format!("small.try_matmul({sx:?})"), &|| small.try_matmul(x));
    }
    assert!(panics.is_empty(), "{} panics:\n{}", panics.len(), panics.join("\n"));
}

#[test]
fn zero_sized_shapes_with_huge_axes_are_shape_errors_naming_the_argument() {
    let e = Tensor::full(&[0], 1.0);
    let msg = e.try_reshape(&[0, usize::MAX]).unwrap_err().to_string();
    assert!(msg.starts_with("reshape: ") && msg.contains(&usize::MAX.to_string()), "{msg}");
    let msg = Tensor::try_full(&[usize::MAX, 0], 1.0).unwrap_err().to_string();
    assert!(msg.starts_with("full: "), "{msg}");
    let msg = Tensor::try_one_hot(&[], usize::MAX).unwrap_err().to_string();
    assert!(msg.starts_with("one_hot: "), "{msg}");
    // At the cap, each axis is still fine beside a 0.
    assert_eq!(e.try_reshape(&[0, 1 << 40]).unwrap().shape(), [0, 1 << 40]);
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_ndarray::<f32>().expect("realizes").iter().copied().collect()
}

// torch.nn.functional.cross_entropy(torch.tensor([[m, m, 0., 0.]]), torch.tensor([0]))
// is ln 2 = 0.6931 for every m: the two large logits cancel.
#[test]
fn cross_entropy_of_large_logits_is_exact() {
    for m in [1e7f32, 1e9, 1e30, 3e38] {
        let x = Tensor::from_vec(vec![m, m, 0.0, 0.0], &[1, 4]);
        let loss = f32s(&x.cross_entropy(&[0]))[0];
        assert!((loss - std::f32::consts::LN_2).abs() < 1e-6, "m = {m}: {loss}");
        // The other rows of the batch are unaffected; target 2 is m + ln 2 away from the top.
        let x = Tensor::from_vec(vec![m, m, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], &[2, 4]);
        let loss = f32s(&x.cross_entropy(&[0, 0]))[0];
        let row2 = ((1.0f64).exp() + 3.0).ln() - 1.0;
        let want = ((std::f64::consts::LN_2 + row2) / 2.0) as f32;
        assert!((loss - want).abs() < 1e-6, "m = {m}: {loss} vs {want}");
    }
}

// torch.log_softmax(torch.tensor([1., inf, 2., 3.]), 0) is [nan, nan, nan, nan].
#[test]
fn log_softmax_with_a_positive_infinity_is_nan() {
    let x = Tensor::from_vec(vec![1.0f32, f32::INFINITY, 2.0, 3.0], &[4]);
    let y = f32s(&x.log_softmax(0));
    assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
    // Rows without +inf keep their values.
    let x = Tensor::from_vec(vec![1.0f32, f32::INFINITY, 0.0, 0.0], &[2, 2]);
    let y = f32s(&x.log_softmax(-1));
    assert!(y[0].is_nan() && y[1].is_nan() && (y[2] + std::f32::consts::LN_2).abs() < 1e-6, "{y:?}");
}

// torch.nn.functional.cross_entropy(torch.tensor([[1., inf, 2., 3.]]), torch.tensor([t]))
// is nan for every t.
#[test]
fn cross_entropy_with_a_positive_infinity_is_nan() {
    for t in 0..4 {
        let x = Tensor::from_vec(vec![1.0f32, f32::INFINITY, 2.0, 3.0], &[1, 4]);
        let loss = f32s(&x.cross_entropy(&[t]))[0];
        assert!(loss.is_nan(), "target {t}: {loss}");
    }
}

// torch.nn.functional.layer_norm(torch.tensor([3e38, -3e38, 3e38, 1.]), [4]) is all nan:
// the variance overflows to inf.
#[test]
fn layer_norm_with_an_overflowing_variance_is_nan() {
    let x = Tensor::from_vec(vec![3e38f32, -3e38, 3e38, 1.0], &[1, 4]);
    let y = f32s(&x.layer_norm(None, None, 1e-5));
    assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
    // A finite variance normalizes as before.
    let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 2]);
    let y = f32s(&x.layer_norm(None, None, 0.0));
    assert_eq!(y, [-1.0, 1.0]);
}

// torch.ones(2**25).sum() is 33554432 and torch.ones(2**26).mean() is 1: torch's partial
// sums are blocked, so a long sum is exact where a running f32 sum would stop at 2^24 per
// accumulator.
#[test]
fn long_sums_are_accurate() {
    let n = 1usize << 25;
    let ones = Tensor::full(&[n], 1.0);
    assert_eq!(f32s(&ones.sum(0, false)), [n as f32]);
    assert_eq!(f32s(&Tensor::full(&[1 << 26], 1.0).mean(0, false)), [1.0]);
    // A length that is no multiple of any block, along a non-last axis, and kept.
    let n = (1 << 25) + 12_345;
    let ones = Tensor::full(&[n, 2], 1.0);
    assert_eq!(f32s(&ones.sum(0, true)), [n as f32; 2]);
    // Values of mixed sign and size: the f64 sum rounded to f32, within a few ulps.
    let n = (1 << 22) + 3;
    let v: Vec<f32> = (0..n).map(|i| ((i % 1000) as f32 - 400.0) * 0.37).collect();
    let want: f64 = v.iter().map(|&x| x as f64).sum();
    let got = f32s(&Tensor::from_vec(v, &[n]).sum(0, false))[0] as f64;
    assert!((got - want).abs() <= 8.0 * f32::EPSILON as f64 * want.abs(), "{got} vs {want}");
}

// torch.autograd.grad(torch.abs(x).sum(), x) at x = [0, -0, -2, 3] is [0, 0, -1, 1].
#[test]
fn the_derivative_of_abs_at_zero_is_zero() {
    let x = Tensor::from_vec(vec![0.0f32, -0.0, -2.0, 3.0], &[4]);
    let g = gradient(&x.abs().sum(0, false), &[&x]).unwrap();
    assert_eq!(f32s(&g[0]), [0.0, 0.0, -1.0, 1.0]);
    assert_eq!(f32s(&x.abs()), [0.0, 0.0, 2.0, 3.0]);
    assert!(f32s(&x.abs()).iter().all(|v| v.is_sign_positive()), "abs(-0) is +0");
}

// torch: y.backward() on a non-scalar y raises "grad can be implicitly created only for
// scalar outputs"; a one-element output is fine.
#[test]
fn the_gradient_of_a_non_scalar_output_is_an_error_naming_its_shape() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    let msg = gradient(&(&x * 2.0), &[&x]).unwrap_err().to_string();
    assert!(msg.starts_with("gradient: ") && msg.contains("[3]"), "{msg}");
    let one = (&x * 2.0).sum(0, true);
    assert_eq!(one.shape(), [1]);
    assert_eq!(f32s(&gradient(&one, &[&x]).unwrap()[0]), [2.0; 3]);
}

// exp of arguments whose results are subnormal, against f64 exp rounded to f32. `exp` is
// `exp2(x * log2 e)` and the product is rounded to f32 (|x log2 e| < 2^8, so within 2^-17),
// which allows a relative error of 2^-17 ln 2 < 6e-6 on top of the rounding of the result.
#[test]
fn exp_in_the_subnormal_range_is_accurate() {
    let xs = [-87.0f32, -87.5, -88.0, -90.0, -100.0, -103.0, -103.9, -104.0, -110.0, -200.0];
    let y = f32s(&Tensor::from_vec(xs.to_vec(), &[xs.len()]).exp());
    let ulp = f32::from_bits(1) as f64; // 2^-149, the spacing of the subnormals
    for (&x, &got) in xs.iter().zip(&y) {
        let want = (x as f64).exp() as f32 as f64;
        let tol = 2.0 * ulp + 6e-6 * want;
        assert!((got as f64 - want).abs() <= tol, "exp({x}) = {got:e}, want {want:e}");
    }
    assert_eq!(y[xs.len() - 1], 0.0);
}

// torch.ones(2, 2**25) @ torch.ones(2**25) is 33554432 in each row: a matrix times a vector
// sums its long contraction in blocks, as a long sum does, whichever loop runs it.
#[test]
fn long_matrix_vector_products_are_accurate() {
    let n = 1usize << 25;
    let column = Tensor::full(&[n], 1.0);
    assert_eq!(f32s(&Tensor::full(&[2, n], 1.0).matmul(&column)), [n as f32; 2]);
    // A dot product of a length that fills no whole block.
    let v = Tensor::full(&[n + 3], 1.0);
    assert_eq!(f32s(&v.matmul(&v)), [(n + 3) as f32]);
    // Values of mixed sign and size: the f64 product rounded to f32, within a few ulps.
    let (rows, k) = (3, (1 << 20) + 5);
    let x: Vec<f32> = (0..rows * k).map(|i| ((i % 1000) as f32 - 400.0) * 0.37).collect();
    let y: Vec<f32> = (0..k).map(|i| ((i % 7) as f32 - 2.5) * 0.5).collect();
    let got = f32s(&Tensor::from_vec(x.clone(), &[rows, k]).matmul(&Tensor::from_vec(y.clone(), &[k])));
    for (r, g) in got.iter().enumerate() {
        let row = &x[r * k..(r + 1) * k];
        let want: f64 = row.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = row.iter().zip(&y).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        assert!((*g as f64 - want).abs() <= 8.0 * f32::EPSILON as f64 * scale, "row {r}: {g} vs {want}");
    }
}
