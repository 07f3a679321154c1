//! Random small graphs against an f64 reference, realized unfused and fused.

use crate::common::*;
use ndarray::{Array2, ArrayD, Axis, s};
use proptest::prelude::*;
use uopc_tensor::*;

#[derive(Clone, Debug)]
enum G {
    Leaf(usize),
    Add(Box<G>, Box<G>),
    Sub(Box<G>, Box<G>),
    Mul(Box<G>, Box<G>),
    Max(Box<G>, Box<G>),
    Neg(Box<G>),
    Exp(Box<G>),
    /// `x.sum(axis, keepdim) * x`: a reduce broadcast back.
    SumMul(Box<G>, usize),
    /// `x - x.max(axis, keepdim)`.
    MaxSub(Box<G>, usize),
    /// `x.reshape(4, 3).T`: a reshape of a permuted view.
    Flip(Box<G>),
    /// `cat(x[:, 1:], x[:, :1])`: shrink and cat.
    Roll(Box<G>),
    Softmax(Box<G>, usize),
    /// `x @ w` with a 4x4 weight: a broadcast-multiply-reduce.
    MatMul(Box<G>),
    /// `x.T.T`-style permute of a broadcast: `(x + row).permute([1, 0]).permute([1, 0])`
    /// where `row` is a (1, 4) leaf expanded over the rows.
    BroadcastRow(Box<G>),
}

fn graph() -> impl Strategy<Value = G> {
    let leaf = (0usize..3).prop_map(G::Leaf);
    leaf.prop_recursive(4, 24, 2, |inner| {
        let b = |f: fn(Box<G>, Box<G>) -> G| {
            (inner.clone(), inner.clone()).prop_map(move |(x, y)| f(Box::new(x), Box::new(y)))
        };
        prop_oneof![
            b(G::Add),
            b(G::Sub),
            b(G::Mul),
            b(G::Max),
            inner.clone().prop_map(|x| G::Neg(Box::new(x))),
            inner.clone().prop_map(|x| G::Exp(Box::new(x))),
            (inner.clone(), 0usize..2).prop_map(|(x, a)| G::SumMul(Box::new(x), a)),
            (inner.clone(), 0usize..2).prop_map(|(x, a)| G::MaxSub(Box::new(x), a)),
            inner.clone().prop_map(|x| G::Flip(Box::new(x))),
            inner.clone().prop_map(|x| G::Roll(Box::new(x))),
            (inner.clone(), 0usize..2).prop_map(|(x, a)| G::Softmax(Box::new(x), a)),
            inner.clone().prop_map(|x| G::MatMul(Box::new(x))),
            inner.prop_map(|x| G::BroadcastRow(Box::new(x))),
        ]
    })
}

fn build(g: &G, leaves: &[Tensor], w: &Tensor, row: &Tensor) -> Tensor {
    let r = |x: &G| build(x, leaves, w, row);
    match g {
        G::Leaf(i) => leaves[*i].clone(),
        G::Add(a, b) => r(a) + r(b),
        G::Sub(a, b) => r(a) - r(b),
        G::Mul(a, b) => r(a) * r(b),
        G::Max(a, b) => r(a).maximum(&r(b)),
        G::Neg(a) => -r(a),
        G::Exp(a) => (r(a) * 0.25).exp(),
        G::SumMul(a, ax) => {
            let x = r(a);
            x.sum(*ax as isize, true) * x
        }
        G::MaxSub(a, ax) => {
            let x = r(a);
            &x - x.max(*ax as isize, true)
        }
        G::Flip(a) => r(a).reshape(&[4, 3]).t(),
        G::Roll(a) => {
            let x = r(a);
            Tensor::cat(&[&x.slice(1, 1, 4), &x.slice(1, 0, 1)], 1)
        }
        G::Softmax(a, ax) => r(a).softmax(*ax as isize),
        G::MatMul(a) => r(a).matmul(w) * 0.5,
        G::BroadcastRow(a) => (r(a) + row).permute(&[1, 0]).permute(&[1, 0]),
    }
}

/// The reference value and the largest magnitude seen on the way (errors scale with it).
fn eval(g: &G, leaves: &[Array2<f64>], w: &Array2<f64>, row: &Array2<f64>) -> (Array2<f64>, f64) {
    let r = |x: &G| eval(x, leaves, w, row);
    let (v, m) = match g {
        G::Leaf(i) => (leaves[*i].clone(), 0.0),
        G::Add(a, b) | G::Sub(a, b) | G::Mul(a, b) | G::Max(a, b) => {
            let ((x, mx), (y, my)) = (r(a), r(b));
            let v = match g {
                G::Add(..) => &x + &y,
                G::Sub(..) => &x - &y,
                G::Mul(..) => &x * &y,
                _ => ndarray::Zip::from(&x).and(&y).map_collect(|&p, &q| p.max(q)),
            };
            (v, mx.max(my))
        }
        G::Neg(a) => {
            let (x, m) = r(a);
            (-x, m)
        }
        G::Exp(a) => {
            let (x, m) = r(a);
            (x.mapv(|v| (v * 0.25).exp()), m)
        }
        G::SumMul(a, ax) => {
            let (x, m) = r(a);
            let s = x.sum_axis(Axis(*ax)).insert_axis(Axis(*ax));
            let mm = s.iter().fold(m, |acc, v| acc.max(v.abs()));
            (&s * &x, mm)
        }
        G::MaxSub(a, ax) => {
            let (x, m) = r(a);
            let mx = x.map_axis(Axis(*ax), |l| l.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
            (&x - &mx.insert_axis(Axis(*ax)), m)
        }
        G::Flip(a) => {
            let (x, m) = r(a);
            let flat: Vec<f64> = x.iter().cloned().collect();
            (
                Array2::from_shape_vec((4, 3), flat)
                    .unwrap()
                    .reversed_axes()
                    .as_standard_layout()
                    .into_owned(),
                m,
            )
        }
        G::Roll(a) => {
            let (x, m) = r(a);
            (ndarray::concatenate(Axis(1), &[x.slice(s![.., 1..]), x.slice(s![.., ..1])]).unwrap(), m)
        }
        G::Softmax(a, ax) => {
            let (x, m) = r(a);
            let mx = x
                .map_axis(Axis(*ax), |l| l.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                .insert_axis(Axis(*ax));
            let e = (&x - &mx).mapv(f64::exp);
            let s = e.sum_axis(Axis(*ax)).insert_axis(Axis(*ax));
            (&e / &s, m)
        }
        G::MatMul(a) => {
            let (x, m) = r(a);
            let v = x.dot(w) * 0.5;
            (v, m * 4.0)
        }
        G::BroadcastRow(a) => {
            let (x, m) = r(a);
            (&x + row, m)
        }
    };
    let mm = v.iter().fold(m, |acc, x| acc.max(x.abs()));
    (v, mm)
}

/// Cases per run: `UOPC_GRAPH_CASES` raises the default of 32 (CI runs 2,000).
fn cases() -> u32 {
    std::env::var("UOPC_GRAPH_CASES").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(32)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn random_graphs_match_the_reference(g in graph(), seed in 0u64..100_000) {
        let arrays: Vec<ArrayD<f32>> = (0..3).map(|k| uniform(&[3, 4], -1.5, 1.5, seed * 5 + k)).collect();
        let w_arr = uniform(&[4, 4], -1.0, 1.0, seed * 5 + 3);
        let row_arr = uniform(&[1, 4], -1.0, 1.0, seed * 5 + 4);
        let leaves: Vec<Tensor> = arrays.iter().map(Tensor::from_array).collect();
        let (w, row) = (Tensor::from_array(&w_arr), Tensor::from_array(&row_arr));
        let refs: Vec<Array2<f64>> = arrays.iter().map(|a| f64s(a).into_dimensionality().unwrap()).collect();
        let w_ref: Array2<f64> = f64s(&w_arr).into_dimensionality().unwrap();
        let row_ref: Array2<f64> = f64s(&row_arr).into_dimensionality().unwrap();
        let (want, mag) = eval(&g, &refs, &w_ref, &row_ref);
        let want = want.into_dyn();
        let t = build(&g, &leaves, &w, &row);
        // f32 rounding relative to the largest intermediate: a few dozen roundings at most
        let tol = 1e-5 * (1.0 + mag);
        let mut results = Vec::new();
        for opts in [RealizeOptions::default(), RealizeOptions::fused(), RealizeOptions::default().with_opt(NoOpt)] {
            let got = t.to_ndarray_with::<f32>(&opts).unwrap();
            let e = abs_err(&got, &want);
            prop_assert!(e <= tol, "{:?} with fuse_reduce={}: error {:e} > {:e}", g, opts.fuse_reduce, e, tol);
            results.push(got);
        }
        // fused against unfused realize of the same graph
        let e = abs_err(&results[1], &results[0].mapv(|x| x as f64).into_dyn());
        prop_assert!(e <= 2.0 * tol, "{:?}: fused and unfused differ by {:e}", g, e);
    }
}
