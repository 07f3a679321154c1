//! Reverse-mode gradients of every differentiable Tensor op against central finite differences,
//! all in f64.
//!
//! Each check builds `loss = sum(f(x..) * w)` with fixed random weights `w` (so every output
//! element gets a different cotangent), realizes `gradient(loss, x..)` and compares each element
//! with `(loss(x + h) - loss(x - h)) / 2h`. With h = 1e-5 the truncation error is about
//! h^2 |f'''| ~ 1e-9 and the rounding error about 1e-16 / h ~ 1e-11, so a tolerance of 1e-6
//! relative to 1 + |gradient| is loose for correct rules and far below any wrong term.
//! Inputs avoid non-differentiable points (ties of max, zero of relu) except in the tests that
//! pin down the tie rule exactly.

use crate::common::{check, rand64, uniform};
use ndarray::{ArrayD, IxDyn};
use uopc_ir::DType;
use uopc_tensor::attention::attention;
use uopc_tensor::*;

#[test]
fn binary_ops_with_broadcasting() {
    let a = rand64(&[3, 1, 4], -2.0, 2.0, 1);
    let b = rand64(&[5, 1], 0.5, 2.0, 2);
    let ins = [a, b];
    check("add", &ins, |x| &x[0] + &x[1]);
    check("sub", &ins, |x| &x[0] - &x[1]);
    check("mul", &ins, |x| &x[0] * &x[1]);
    check("div", &ins, |x| &x[0] / &x[1]);
    check("maximum", &ins, |x| x[0].maximum(&x[1]));
    check("chain", &ins, |x| (&x[0] * &x[1] - &x[0]) / (&x[1] + 3.0));
}

#[test]
fn scalar_operands_on_both_sides() {
    let a = [rand64(&[4, 3], 0.5, 2.0, 3)];
    check("x+2", &a, |x| &x[0] + 2.0);
    check("2-x", &a, |x| 2.0 - &x[0]);
    check("x*3", &a, |x| &x[0] * 3.0);
    check("x/4", &a, |x| &x[0] / 4.0);
    check("1/x", &a, |x| 1.0 / &x[0]);
    check("x*x", &a, |x| &x[0] * &x[0]);
}

#[test]
fn unary_ops() {
    let pos = [rand64(&[2, 5], 0.2, 3.0, 4)];
    check("neg", &pos, |x| -&x[0]);
    check("exp", &pos, |x| x[0].exp());
    check("exp2", &pos, |x| x[0].exp2());
    check("log", &pos, |x| x[0].log());
    check("log2", &pos, |x| x[0].log2());
    check("sqrt", &pos, |x| x[0].sqrt());
    check("recip", &pos, |x| x[0].recip());
    check("exp(log)", &pos, |x| x[0].log().exp() * x[0].sqrt());
    // no element within 0.05 of relu's kink
    let signed = rand64(&[3, 4], -1.0, 1.0, 5).mapv(|v| if v.abs() < 0.05 { v + 0.2 } else { v });
    check("relu", &[signed], |x| x[0].relu());
}

#[test]
fn where_routes_the_gradient_to_the_chosen_branch() {
    let a = rand64(&[3, 4], -1.0, 1.0, 6);
    let b = rand64(&[4], -1.0, 1.0, 7);
    check("where", &[a, b], |x| x[0].lt(&x[1]).where_(&(&x[0] * 2.0), &x[1].exp()));
}

#[test]
fn reductions_over_every_axis() {
    let a = [rand64(&[3, 4, 5], -2.0, 2.0, 8)];
    for axis in [0isize, 1, 2, -1] {
        for keep in [false, true] {
            check("sum", &a, |x| x[0].sum(axis, keep));
            check("max", &a, |x| x[0].max(axis, keep));
        }
    }
    check("sum of sums", &a, |x| x[0].sum(0, false).sum(1, true));
}

#[test]
fn max_splits_the_gradient_evenly_between_ties() {
    let x = Tensor::from_vec(vec![1.0f64, 3.0, 3.0, 2.0, 5.0, 4.0, 5.0, 5.0], &[2, 4]);
    let g = gradient(&x.max(1, false).sum(0, false), &[&x]).unwrap().remove(0);
    let want = [0.0, 0.5, 0.5, 0.0, 1.0 / 3.0, 0.0, 1.0 / 3.0, 1.0 / 3.0];
    let got = g.to_ndarray::<f64>().unwrap();
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() < 1e-15, "{got:?}");
    }
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3]);
    let b = Tensor::from_vec(vec![2.0f64, 2.0, 2.0], &[3]);
    let ga = gradient(&a.maximum(&b).sum(0, false), &[&a, &b]).unwrap();
    assert_eq!(ga[0].to_ndarray::<f64>().unwrap().into_raw_vec_and_offset().0, vec![0.0, 0.5, 1.0]);
    assert_eq!(ga[1].to_ndarray::<f64>().unwrap().into_raw_vec_and_offset().0, vec![1.0, 0.5, 0.0]);
}

#[test]
fn movement_ops() {
    let a = [rand64(&[2, 3, 4], -1.0, 1.0, 10)];
    check("reshape", &a, |x| x[0].reshape(&[6, 4]));
    check("permute", &a, |x| x[0].permute(&[2, 0, 1]));
    check("transpose+reshape", &a, |x| x[0].transpose(0, 2).reshape(&[4, 6]));
    check("expand", &[rand64(&[3, 1, 2], -1.0, 1.0, 11)], |x| x[0].expand(&[3, 4, 2]));
    check("shrink", &a, |x| x[0].shrink(&[(1, 2), (0, 2), (1, 4)]));
    check("slice", &a, |x| x[0].slice(-1, 1, 3) * x[0].slice(-1, 0, 2));
    check("permute+shrink+sum", &a, |x| {
        x[0].permute(&[2, 0, 1]).shrink(&[(1, 3), (0, 2), (1, 3)]).sum(1, true)
    });
}

#[test]
fn stack_and_cat() {
    let ins =
        [rand64(&[2, 3], -1.0, 1.0, 12), rand64(&[2, 3], -1.0, 1.0, 13), rand64(&[2, 5], -1.0, 1.0, 14)];
    for axis in 0..3 {
        check("stack", &ins, |x| Tensor::stack(&[&x[0], &x[1], &x[0]], axis));
    }
    check("cat axis 1", &ins, |x| Tensor::cat(&[&x[0], &x[2], &x[1]], 1));
    check("cat axis 0", &ins, |x| Tensor::cat(&[&x[0], &x[1]], 0).exp());
}

#[test]
fn matmul_through_its_primitives() {
    for (n, k, m) in [(3, 4, 2), (5, 7, 3), (1, 4, 1)] {
        let ins = [rand64(&[n, k], -1.0, 1.0, 15), rand64(&[k, m], -1.0, 1.0, 16)];
        check("matmul", &ins, |x| x[0].matmul(&x[1]));
        let ins = [rand64(&[n, k], -1.0, 1.0, 17), rand64(&[m, k], -1.0, 1.0, 18)];
        check("matmul by a transposed view", &ins, |x| x[0].matmul(&x[1].t()));
    }
}

#[test]
fn softmax_along_each_axis() {
    let a = [rand64(&[3, 4, 5], -3.0, 3.0, 19)];
    for axis in 0..3 {
        check("softmax", &a, |x| x[0].softmax(axis));
    }
}

#[test]
fn attention_one_liner() {
    let ins =
        [rand64(&[5, 3], -1.0, 1.0, 20), rand64(&[5, 3], -1.0, 1.0, 21), rand64(&[5, 3], -1.0, 1.0, 22)];
    check("attention", &ins, |x| attention(&x[0], &x[1], &x[2]));
}

#[test]
fn cast_carries_the_gradient_back_in_the_source_dtype() {
    let x = Tensor::from_array(&rand64(&[3, 4], -1.0, 1.0, 23));
    let w = uniform(&[3, 4], -1.0, 1.0, 24);
    let loss = (x.cast(DType::F32) * Tensor::from_array(&w)).reshape(&[12]).sum(0, false);
    let g = gradient(&loss, &[&x]).unwrap().remove(0);
    assert_eq!(g.dtype(), DType::F64);
    // the gradient of a cast is the cotangent cast back: exactly w
    assert_eq!(g.to_ndarray::<f64>().unwrap(), w.mapv(|v| v as f64));
    // f32 in, f64 math inside: the f32 gradient is exp(x) rounded once
    let a = uniform(&[5], -1.0, 1.0, 25);
    let xf = Tensor::from_array(&a);
    let g = gradient(&xf.cast(DType::F64).exp().sum(0, false), &[&xf]).unwrap().remove(0);
    assert_eq!(g.dtype(), DType::F32);
    for (got, x) in g.to_ndarray::<f32>().unwrap().iter().zip(a.iter()) {
        let want = (*x as f64).exp();
        assert!((*got as f64 - want).abs() <= 1e-6 * want, "{got} vs {want}");
    }
    // a cast to bool has no gradient
    let gb = gradient(&x.gt(&x.sum(1, true)).cast(DType::F64).sum(1, false).sum(0, false), &[&x]).unwrap();
    assert!(gb[0].to_ndarray::<f64>().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn detach_stops_gradients() {
    let a = rand64(&[4], 0.5, 2.0, 26);
    let x = Tensor::from_array(&a);
    // d/dx sum(x * stop(x)) = x, not 2x
    let g = gradient(&(&x * x.detach()).sum(0, false), &[&x]).unwrap().remove(0);
    assert_eq!(g.to_ndarray::<f64>().unwrap(), a);
    // a loss that only sees x through detach has zero gradient, and so does an unused parameter
    let y = Tensor::from_array(&rand64(&[2, 2], 0.5, 2.0, 27));
    let gs = gradient(&x.detach().exp().sum(0, false), &[&x, &y]).unwrap();
    assert!(gs[0].to_ndarray::<f64>().unwrap().iter().all(|&v| v == 0.0));
    assert_eq!(gs[1].shape(), [2, 2]);
    assert!(gs[1].to_ndarray::<f64>().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn gradients_of_intermediate_nodes_and_non_scalar_outputs() {
    let a = rand64(&[3, 2], -1.0, 1.0, 28);
    let x = Tensor::from_array(&a);
    let h = x.exp();
    let y = &h * &h;
    // Not reduced: an implicit gradient is an error, a vjp with ones is the sum's gradient.
    assert!(gradient(&y, &[&x]).is_err());
    let g = vjp(&y, &[&h, &x], &Tensor::full_dtype(&[3, 2], 1.0, y.dtype())).unwrap();
    let gh = g[0].to_ndarray::<f64>().unwrap();
    let gx = g[1].to_ndarray::<f64>().unwrap();
    // `exp` scales by log2(e) rounded to f32 (relative error ~3e-8), hence 1e-6
    for ((&v, &dh), &dx) in a.iter().zip(gh.iter()).zip(gx.iter()) {
        assert!((dh - 2.0 * v.exp()).abs() < 1e-6 * (1.0 + dh.abs()), "{dh} vs {}", 2.0 * v.exp());
        assert!((dx - 2.0 * (2.0 * v).exp()).abs() < 1e-6 * (1.0 + dx.abs()), "{dx}");
    }
    // vjp with an explicit cotangent
    let c = rand64(&[3, 2], -1.0, 1.0, 29);
    let gv = vjp(&x.exp(), &[&x], &Tensor::from_array(&c)).unwrap().remove(0);
    let want = ArrayD::from_shape_fn(IxDyn(&[3, 2]), |ix| c[&ix] * a[&ix].exp());
    let got = gv.to_ndarray::<f64>().unwrap();
    assert!(got.iter().zip(want.iter()).all(|(g, w)| (g - w).abs() < 1e-6));
    assert!(vjp(&x, &[&x], &Tensor::from_array(&rand64(&[2, 3], 0.0, 1.0, 1))).is_err());
}

#[test]
fn deep_graphs_do_not_recurse() {
    // 20k nested nodes: the backward walk is a loop over a toposort, never a recursion
    let x = Tensor::from_vec(vec![0.5f64, 0.25], &[2]);
    let mut y = x.clone();
    for _ in 0..10_000 {
        y = &y * 1.0 + 1e-4;
    }
    let g = gradient(&y.sum(0, false), &[&x]).unwrap().remove(0);
    assert_eq!(g.shape(), [2]);
}
