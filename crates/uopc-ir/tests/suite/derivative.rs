//! `derivative`: each rule against central differences of the expression itself, evaluated by
//! the interpreter in f64, over points on both sides of every kink.

use uopc_ir::interp::{Precision, run};
use uopc_ir::*;

const POINTS: [f32; 8] = [-2.3, -1.1, -0.4, 0.3, 0.45, 0.8, 1.7, 2.9];

/// `f(x)` (and its derivative with respect to `x`, when it has one) at `xs`, where `x` is
/// the load of element `i` of buffer 0 and `y` that of buffer 1 (`ys`).
fn eval(f: &dyn Fn(&UOp, &UOp, &UOp) -> UOp, xs: &[f32], ys: &[f32], wrt_y: bool) -> (Vec<f32>, Vec<f32>) {
    let n = xs.len();
    let mut pb = ProgramBuilder::new();
    let i = pb.range(n, AxisType::Loop);
    let x = buffer(0, DType::F32, n).index(&i).load();
    let y = buffer(1, DType::F32, n).index(&i).load();
    let value = f(&x, &y, &i);
    let slope = derivative(&value, if wrt_y { &y } else { &x }).expect("differentiable");
    let slope = slope.unwrap_or_else(|| f32c(0.0));
    let program = sink(&[sink(&[
        buffer(2, DType::F32, n).index(&i).store(value),
        buffer(3, DType::F32, n).index(&i).store(slope),
        // Every slot is used, also where `f` does not read `y`.
        buffer(4, DType::F32, n).index(&i).store(y.clone()),
    ])
    .end(&[i])]);
    let mut bufs = vec![
        HostBuffer::F32(xs.to_vec()),
        HostBuffer::F32(ys.to_vec()),
        HostBuffer::F32(vec![0.0; n]),
        HostBuffer::F32(vec![0.0; n]),
        HostBuffer::F32(vec![0.0; n]),
    ];
    run(&program, &mut bufs, Precision::F64).expect("interprets");
    let take = |b: &HostBuffer| match b {
        HostBuffer::F32(v) => v.clone(),
        _ => unreachable!(),
    };
    (take(&bufs[2]), take(&bufs[3]))
}

/// Checks the derivative of `f` with respect to `x` (or `y`) against central differences.
fn check(name: &str, f: &dyn Fn(&UOp, &UOp, &UOp) -> UOp, wrt_y: bool) {
    let ys: Vec<f32> = POINTS.iter().map(|p| 0.5 - p / 3.0).collect();
    let xs = POINTS.to_vec();
    let (_, slope) = eval(f, &xs, &ys, wrt_y);
    let h = 1e-3f32;
    let shifted = |d: f32| {
        let (x2, y2): (Vec<f32>, Vec<f32>) = if wrt_y {
            (xs.clone(), ys.iter().map(|v| v + d).collect())
        } else {
            (xs.iter().map(|v| v + d).collect(), ys.clone())
        };
        eval(f, &x2, &y2, wrt_y).0
    };
    let (up, down) = (shifted(h), shifted(-h));
    for k in 0..xs.len() {
        let want = (f64::from(up[k]) - f64::from(down[k])) / f64::from(2.0 * h);
        let got = f64::from(slope[k]);
        // f32 storage of f(x +- h) leaves about 6e-8 |f| / h of error in the difference.
        assert!((got - want).abs() <= 2e-3 * (1.0 + want.abs()), "{name} at x = {}: {got} vs {want}", xs[k]);
    }
}

#[test]
fn each_rule_matches_central_differences() {
    let tanh = |x: &UOp| {
        let e = (x * (2.0 * std::f64::consts::LOG2_E) as f32).exp2();
        (&e - 1.0f32) * (e + 1.0f32).recip()
    };
    type Case = (&'static str, Box<dyn Fn(&UOp, &UOp, &UOp) -> UOp>);
    let cases: Vec<Case> = vec![
        ("x^2 + 2^x", Box::new(|x, _, _| x * x + x.exp2())),
        ("softcap", Box::new(move |x, _, _| tanh(&(x * 0.5f32)) * 2.0f32)),
        ("log2(x^2 + 1)", Box::new(|x, _, _| (x * x + 1.0f32).log2())),
        ("sqrt(x^2 + 1)", Box::new(|x, _, _| (x * x + 1.0f32).sqrt())),
        ("1 / (x + 3)", Box::new(|x, _, _| (x + 3.0f32).recip())),
        ("x / (y + 2)", Box::new(|x, y, _| x / (y + 2.0f32))),
        ("-x + y", Box::new(|x, y, _| -x + y)),
        ("max(x, 0.5)", Box::new(|x, _, _| x.maximum(0.5f32))),
        ("max(0.1, -x)", Box::new(|x, _, _| f32c(0.1).maximum(-x))),
        ("where(x < 0, -x, 2x)", Box::new(|x, _, _| x.lt(0.0f32).where_(-x, x * 2.0f32))),
        ("alibi", Box::new(|x, y, i| x + y * (i - 3).cast(DType::F32))),
        ("x - floor-ish", Box::new(|x, _, _| x - (x * 4.0f32).cast(DType::INDEX).cast(DType::F32))),
    ];
    for (name, f) in &cases {
        check(name, f.as_ref(), false);
        check(&format!("{name}, with respect to y"), f.as_ref(), true);
    }
}

#[test]
fn integer_paths_and_other_leaves_have_no_derivative() {
    let x = buffer(0, DType::F32, 4).index(idx(1)).load();
    let y = buffer(1, DType::F32, 4).index(idx(2)).load();
    assert!(derivative(&(&y * 3.0f32), &x).unwrap().is_none());
    assert!(derivative(&x.cast(DType::I32).cast(DType::F32), &x).unwrap().is_none());
    assert!(derivative(&x.lt(&y).where_(1.0f32, 2.0f32), &x).unwrap().is_none());
    assert!(derivative(&(&x * &y), &x).unwrap().is_some());
}

#[test]
fn a_node_without_a_rule_is_an_error_naming_it() {
    let x = buffer(0, DType::F32, 4).index(idx(0)).load();
    let store = buffer(1, DType::F32, 4).index(idx(0)).store(x.clone());
    let odd = UOp::new(Op::After, DType::F32, vec![x.clone(), store]);
    let err = derivative(&(&odd + 1.0f32), &x).unwrap_err();
    assert_eq!(err.kind, IrErrorKind::Structure);
    assert!(err.reason.contains("no derivative rule"), "{err}");
}
