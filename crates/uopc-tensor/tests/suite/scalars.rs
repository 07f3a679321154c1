//! Host scalars as operands (`&x * 0.1`, `1 - &x`, `pow_scalar`, `clamp`, `full_like`): the
//! scalar takes the tensor's dtype, so f64 graphs are f64 arithmetic to the bit, f32 graphs
//! are what they were, and integer tensors stay integers with integer scalars.

use crate::common::normal;
use uopc_ir::DType;
use uopc_tensor::Tensor;

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_ndarray::<f64>().expect("realizes").iter().copied().collect()
}
fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_ndarray::<f32>().expect("realizes").iter().copied().collect()
}
fn i32s(t: &Tensor) -> Vec<i32> {
    t.to_ndarray::<i32>().expect("realizes").iter().copied().collect()
}
fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_ndarray::<i64>().expect("realizes").iter().copied().collect()
}

/// f64 inputs over many binades, signs and a few exact values (0, 1, powers of two).
fn inputs() -> Vec<f64> {
    let mut v: Vec<f64> = normal(&[200], 7).iter().map(|&z| f64::from(z)).collect();
    for (k, x) in v.iter_mut().enumerate() {
        // Spread the magnitudes from 1e-12 to 1e12 and add bits f32 does not have.
        *x = *x * 10f64.powi((k % 25) as i32 - 12) * (1.0 + 1e-13 * k as f64);
    }
    v.extend([0.0, -0.0, 1.0, -1.0, 0.5, 1024.0, 3.0, 1e300, -1e-300]);
    v
}

/// A named tensor expression and the host arithmetic it must match.
type Case<T> = (&'static str, Tensor, Box<dyn Fn(T) -> T>);

/// The number of representable f64s between `a` and `b` (0 when they are the same float).
fn ulps_apart(a: f64, b: f64) -> u64 {
    // Map the sign-magnitude bits onto a monotone integer line.
    let key = |x: f64| {
        let b = x.to_bits() as i64;
        if b < 0 { i64::MIN - b } else { b }
    };
    key(a).abs_diff(key(b))
}

// `x op v` with one f64 constant is a single IEEE operation in the kernel, so it must equal
// Rust's f64 arithmetic bit for bit (no f32 rounding of 0.1 anywhere).
#[test]
fn f64_scalar_arithmetic_is_f64_arithmetic_to_the_bit() {
    let v = inputs();
    let x = Tensor::from_vec(v.clone(), &[v.len()]);
    let cases: [Case<f64>; 5] = [
        ("x * 0.1", &x * 0.1, Box::new(|a: f64| a * 0.1)),
        ("x + 0.1", &x + 0.1, Box::new(|a: f64| a + 0.1)),
        ("x - 0.1", &x - 0.1, Box::new(|a: f64| a - 0.1)),
        ("0.1 - x", 0.1 - &x, Box::new(|a: f64| 0.1 - a)),
        ("0.1 * x", 0.1 * &x, Box::new(|a: f64| 0.1 * a)),
    ];
    for (name, t, f) in cases {
        assert_eq!(t.dtype(), DType::F64, "{name}");
        for (&a, got) in v.iter().zip(f64s(&t)) {
            assert_eq!(got.to_bits(), f(a).to_bits(), "{name} at x = {a:e}: {got:e} vs {:e}", f(a));
        }
    }
}

// `x / v` is `x * fl(1/v)`: fl(1/v) is within half an ulp of 1/v (relative 2^-53), so the exact
// product x fl(1/v) is within 2^-53 |x/v| < 1 ulp of x/v, and its rounding adds half an ulp:
// the result is within 1.5 ulps of x/v, hence the correctly rounded quotient or a neighbour.
// `v / x` is `fl(1/x) * v`, the same bound. A power of two has an exact reciprocal, so
// dividing by one is exact.
#[test]
fn f64_scalar_division_is_within_one_rounding_of_the_quotient() {
    let v = inputs();
    let x = Tensor::from_vec(v.clone(), &[v.len()]);
    let (q, r, by4) = (f64s(&(&x / 0.1)), f64s(&(0.1 / &x)), f64s(&(&x / 4.0)));
    let mut exact = 0;
    for (k, &a) in v.iter().enumerate() {
        assert!(ulps_apart(q[k], a / 0.1) <= 1, "x / 0.1 at {a:e}: {:e} vs {:e}", q[k], a / 0.1);
        if a != 0.0 {
            assert!(ulps_apart(r[k], 0.1 / a) <= 1, "0.1 / x at {a:e}: {:e} vs {:e}", r[k], 0.1 / a);
        }
        assert_eq!(by4[k].to_bits(), (a / 4.0).to_bits(), "x / 4 at {a:e}");
        exact += usize::from(q[k] == a / 0.1);
    }
    // Most quotients are correctly rounded; an f32 reciprocal would have made almost none so.
    assert!(exact * 2 > v.len(), "only {exact} of {} quotients exact", v.len());
}

// On an f32 tensor the scalar is rounded once to f32 and the operation is f32 arithmetic:
// the literal (an f64) and an f32 scalar give the same bits as Rust's f32 operators.
#[test]
fn f32_scalar_arithmetic_is_unchanged() {
    let v: Vec<f32> = normal(&[300], 3).iter().map(|&z| z * 37.0).collect();
    let x = Tensor::from_vec(v.clone(), &[v.len()]);
    let third = (1.0f64 / 3.0) as f32;
    let cases: [Case<f32>; 6] = [
        ("x * 0.1", &x * 0.1, Box::new(|a| a * 0.1f32)),
        ("x * 0.1f32", &x * 0.1f32, Box::new(|a| a * 0.1f32)),
        ("x + 0.1", &x + 0.1, Box::new(|a| a + 0.1f32)),
        ("0.1 - x", 0.1 - &x, Box::new(|a| 0.1f32 - a)),
        ("x / 3.0", &x / 3.0, Box::new(move |a| a * third)),
        ("x * 2", &x * 2, Box::new(|a| a * 2.0)),
    ];
    for (name, t, f) in cases {
        assert_eq!(t.dtype(), DType::F32, "{name}");
        for (&a, got) in v.iter().zip(f32s(&t)) {
            assert_eq!(got.to_bits(), f(a).to_bits(), "{name} at x = {a:e}");
        }
    }
}

#[test]
fn integer_tensors_stay_integers_with_integer_scalars() {
    let a = Tensor::from_vec(vec![3i32, -1, 7, i32::MAX], &[4]);
    let plus = &a + 1;
    assert_eq!(plus.dtype(), DType::I32);
    assert_eq!(i32s(&plus), [4, 0, 8, i32::MIN]); // wraps, as the IR's integer arithmetic does
    assert_eq!(i32s(&(&a * 3i64)), [9, -3, 21, i32::MAX.wrapping_mul(3)]);
    assert_eq!(i32s(&(10 - &a)), [7, 11, 3, 10i32.wrapping_sub(i32::MAX)]);
    // An i64 scalar beyond 2^53 is exact on an i64 tensor (no trip through f64).
    let big = (1i64 << 60) + 1;
    let b = Tensor::from_vec(vec![0i64, 2], &[2]);
    assert_eq!(i64s(&(&b + big)), [big, big + 2]);
    assert_eq!(i64s(&(big - &b)), [big, big - 2]);
    // A float scalar promotes to f32 (torch's default float), never truncating the scalar.
    let scaled = &a * 2.5;
    assert_eq!(scaled.dtype(), DType::F32);
    assert_eq!(f32s(&scaled)[..3], [7.5, -2.5, 17.5]);
    // Division is true division, in f32.
    let half = &a / 2;
    assert_eq!(half.dtype(), DType::F32);
    assert_eq!(f32s(&half)[..3], [1.5, -0.5, 3.5]);
    // `6 / x` is `recip(x) * 6`, as tensor division is.
    assert_eq!(f32s(&(6 / &a))[..3], [2.0, -6.0, (1.0f32 / 7.0) * 6.0]);
    // A bool tensor with an integer scalar computes in the scalar's integer type.
    let mask = Tensor::from_vec(vec![true, false], &[2]);
    let counted = &mask + 1;
    assert_eq!(counted.dtype(), DType::I32);
    assert_eq!(i32s(&counted), [2, 1]);
    assert_eq!((&mask + 1i64).dtype(), DType::I64);
    assert_eq!(f32s(&(&mask * 0.5)), [0.5, 0.0]);
}

#[test]
fn scalar_taking_methods_use_the_tensors_dtype() {
    let v = inputs();
    let x = Tensor::from_vec(v.clone(), &[v.len()]);
    // clamp's bounds are f64 constants on an f64 tensor.
    let c = f64s(&x.clamp(Some(-0.1), Some(0.3)));
    for (&a, got) in v.iter().zip(&c) {
        assert_eq!(got.to_bits(), a.clamp(-0.1, 0.3).to_bits(), "clamp at {a:e}");
    }
    // Integer clamp and integer powers stay integers.
    let n = Tensor::from_vec(vec![-5i64, 2, 9], &[3]);
    let clamped = n.clamp(Some(-1), Some(4));
    assert_eq!((clamped.dtype(), i64s(&clamped)), (DType::I64, vec![-1, 2, 4]));
    assert_eq!(n.clamp(Some(0.5), None).dtype(), DType::F32);
    let cube = n.pow_scalar(3);
    assert_eq!((cube.dtype(), i64s(&cube)), (DType::I64, vec![-125, 8, 729]));
    assert_eq!(i64s(&n.pow_scalar(0)), [1, 1, 1]);
    assert_eq!(f32s(&n.pow_scalar(-1)), [-0.2, 0.5, 1.0 / 9.0]);
    // pow_scalar with a non-integer exponent on f64 uses the f64 exponent.
    let p = Tensor::from_vec(vec![2.0f64, 10.0], &[2]).pow_scalar(0.1);
    for (got, want) in f64s(&p).iter().zip([2f64.powf(0.1), 10f64.powf(0.1)]) {
        assert!((got - want).abs() <= 4e-16 * want, "{got} vs {want}");
    }
    // full_like and scalar_like hold the f64 value, not its f32 rounding.
    assert_eq!(f64s(&x.full_like(0.1))[0], 0.1);
    assert_eq!(x.full_like(0.1).shape(), x.shape());
    let where_small = x.lt(&x.scalar_like(0)).try_where(&x.scalar_like(0.1), &x).expect("broadcasts");
    for (&a, got) in v.iter().zip(f64s(&where_small)) {
        assert_eq!(got, if a < 0.0 { 0.1 } else { a });
    }
    assert_eq!(i32s(&Tensor::from_vec(vec![1i32, 2], &[2]).full_like(2.9)), [2, 2]);
    // Constructors with a dtype convert the fill once to it; the plain ones stay f32.
    assert_eq!(f64s(&Tensor::full_dtype(&[2], 0.1, DType::F64)), [0.1, 0.1]);
    assert_eq!(f64s(&Tensor::full(&[1], 0.1).cast(DType::F64)), [f64::from(0.1f32)]);
    assert_eq!(i64s(&Tensor::full_dtype(&[1], i64::MAX, DType::I64)), [i64::MAX]);
}

// Constants inside composed f64 functions are f64: a GPT-2 GELU written with operators and
// literals, and the library's own tanh and gelu, agree with f64 references to a few ulps.
#[test]
fn constants_in_f64_graphs_are_f64() {
    let v: Vec<f64> = normal(&[256], 11).iter().map(|&z| f64::from(z) * 3.0).collect();
    let x = Tensor::from_vec(v.clone(), &[v.len()]);
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let by_hand = (&x * 0.5) * (1.0 + ((&x + 0.044715 * &(&(&x * &x) * &x)) * c).tanh());
    let want = |a: f64| 0.5 * a * (1.0 + (c * (a + 0.044715 * a * a * a)).tanh());
    // The tanh lowering is within about 1e-15 relative; f32 constants would give 1e-8.
    for (&a, got) in v.iter().zip(f64s(&by_hand)) {
        assert!(
            (got - want(a)).abs() <= 1e-14 * (1.0 + want(a).abs()),
            "gelu by hand at {a}: {got} vs {}",
            want(a)
        );
    }
    for (&a, got) in v.iter().zip(f64s(&x.tanh())) {
        assert!((got - a.tanh()).abs() <= 1e-15, "tanh at {a}: {got} vs {}", a.tanh());
    }
    let gelu_ref = |a: f64| 0.5 * a * (1.0 + libm::erf(a / std::f64::consts::SQRT_2));
    for (&a, got) in v.iter().zip(f64s(&x.gelu())) {
        assert!((got - gelu_ref(a)).abs() <= 1e-14 * (1.0 + a.abs()), "gelu at {a}");
    }
    // exp at 300: the product 300 log2(e) rounds once in f64 (about 4e-14 relative in the
    // result); an f32 log2(e) would be 4e-6 off.
    let e = f64s(&(Tensor::from_vec(vec![300.0f64], &[1]) * 1.0).exp())[0];
    assert!((e / 300f64.exp() - 1.0).abs() < 1e-13, "{e:e}");
}

// The forms that must type-check with unsuffixed literals: each result takes a method call
// directly (one impl applies, so the output type is known without a literal fallback).
#[test]
fn literals_need_no_suffix_and_results_take_methods() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]);
    let n = Tensor::from_vec(vec![1i32, 2], &[2]);
    let forms = [
        (&x + 1.0).exp(),
        (1.0 - &x).exp(),
        (x.clone() * 2.0 / 4.0).relu(),
        (2.0 / x.clone()).sqrt(),
        (&n + 1).cast(DType::F64),
        (1 - &n).cast(DType::F64),
    ];
    let want = [
        vec![2f64.exp(), 3f64.exp()],
        vec![1.0, (-1f64).exp()],
        vec![0.5, 1.0],
        vec![2f64.sqrt(), 1.0],
        vec![2.0, 3.0],
        vec![0.0, -1.0],
    ];
    for (k, (t, w)) in forms.iter().zip(want).enumerate() {
        let got = f64s(t);
        for (g, w) in got.iter().zip(&w) {
            assert!((g - w).abs() <= 4e-16 * w.abs().max(1.0), "form {k}: {got:?} vs {w:?}");
        }
    }
}

#[test]
fn abs_clears_the_sign_of_zero_and_keeps_nan() {
    let x = Tensor::from_vec(vec![-0.0f64, 0.0, -2.5, 3.0, f64::NAN, f64::NEG_INFINITY], &[6]);
    let got = f64s(&x.abs());
    assert_eq!(got[0].to_bits(), 0.0f64.to_bits(), "abs(-0.0) = {:?}", got[0]);
    assert_eq!(got[1].to_bits(), 0.0f64.to_bits());
    assert_eq!(&got[2..4], &[2.5, 3.0]);
    assert!(got[4].is_nan() && got[5] == f64::INFINITY, "{got:?}");
    let x32 = Tensor::from_vec(vec![-0.0f32, -1.0], &[2]);
    let got32 = f32s(&x32.abs());
    assert_eq!(got32[0].to_bits(), 0.0f32.to_bits(), "f32 abs(-0.0) = {:?}", got32[0]);
    assert_eq!(got32[1], 1.0);
}
