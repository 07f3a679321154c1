//! The body's exponential on `TILE_EXP_ROWS`: when the body evaluated after the row tile op
//! computes `exp2(k (x - h(row)))` of the rows it reduced (softmax, the cross-entropy
//! gradient), each task computes a row's exponentials with the tile op into a row tile and the
//! body's loop reads them there. Tested: the plan's structure (the exponential tile op reads
//! the logits in place, no exp2 in the loop that writes the output, a task's rows fit in L2),
//! values against f64 on this path and on the one without it (rows too long for the row tile),
//! and the refusals that keep the body's exponential in its loop.

use ndarray::{Array2, ArrayD};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::ir::{Op, Stmt, TileOp, UOp, UnaryOp, linearize, view_base};
use uopc::tensor::gradient;
use uopc::{RealizeOptions, Tensor, make_plan};

const LOG2E: f32 = std::f32::consts::LOG2_E;

fn logits(rows: usize, cols: usize, seed: u64) -> Array2<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    Array2::from_shape_fn((rows, cols), |(i, _)| {
        let scale = if i % 2 == 1 { 300.0 } else { 8.0 };
        rng.random_range(-scale..scale)
    })
}

/// The tile ops of the plan's kernels, by kind: (max-sum-exp calls, exp-rows calls).
fn tile_ops(t: &Tensor) -> (Vec<UOp>, Vec<UOp>) {
    let plan = make_plan(std::slice::from_ref(t.uop()), &RealizeOptions::fused()).unwrap();
    let nodes = UOp::toposort(&plan.kernels.iter().map(|k| k.program.clone()).collect::<Vec<_>>());
    let of = |f: fn(&TileOp) -> bool| -> Vec<UOp> {
        nodes.iter().filter(|u| matches!(u.op(), Op::Tile(t) if f(t))).cloned().collect()
    };
    (of(|t| matches!(t, TileOp::MaxSumExp { .. })), of(|t| matches!(t, TileOp::ExpRows { .. })))
}

/// Softmax and the cross-entropy gradient of `x` (targets from `seed`) with their f64 values.
fn cases(x: &Array2<f32>, seed: u64) -> Vec<(&'static str, Tensor, ArrayD<f64>)> {
    let (n, c) = x.dim();
    let mut rng = StdRng::seed_from_u64(seed);
    let targets: Vec<usize> = (0..n).map(|_| rng.random_range(0..c)).collect();
    let state: Vec<(f64, f64)> = x
        .rows()
        .into_iter()
        .map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
            (m, row.iter().map(|&v| (f64::from(v) - m).exp()).sum())
        })
        .collect();
    let probs =
        Array2::from_shape_fn((n, c), |(i, j)| (f64::from(x[[i, j]]) - state[i].0).exp() / state[i].1);
    let grad_want = Array2::from_shape_fn((n, c), |(i, j)| {
        (probs[[i, j]] - if j == targets[i] { 1.0 } else { 0.0 }) / n as f64
    });
    let t = Tensor::from_array(x);
    let grad = gradient(&t.cross_entropy(&targets), &[&t]).unwrap().remove(0);
    vec![("softmax", t.softmax(-1), probs.into_dyn()), ("ce_grad", grad, grad_want.into_dyn())]
}

fn max_abs_err(got: &ArrayD<f32>, want: &ArrayD<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape());
    got.iter().zip(want.iter()).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max)
}

#[test]
fn softmax_and_the_cross_entropy_gradient_match_f64_with_and_without_the_exp_tile_op() {
    // 33000 columns are more than the row tile holds: the old path (the loop's exponential)
    for (k, &(rows, cols, on_exp_rows)) in
        [(1, 1, true), (3, 17, true), (6, 2049, true), (4, 32000, true), (2, 33000, false)].iter().enumerate()
    {
        let x = logits(rows, cols, 300 + k as u64);
        for (name, y, want) in cases(&x, k as u64) {
            let (sums, exps) = tile_ops(&y);
            assert_eq!(sums.len(), 1, "{name} {rows}x{cols}: on the row tile op");
            assert_eq!(exps.len(), usize::from(on_exp_rows), "{name} {rows}x{cols}: exp tile op");
            let got = y.realize_with(&RealizeOptions::fused()).unwrap().0.to_ndarray::<f32>().unwrap();
            // probabilities are at most 1 (gradients at most 1/n): f32 exponentials with
            // 1.2e-7 relative error, the exponent's rounding at magnitudes to 600 (600 * 2^-24
            // of a unit exponent, 3.6e-5) and the f32 normalizer give at most 4e-5 absolute
            let err = max_abs_err(&got, &want);
            assert!(err < 4e-5, "{name} {rows}x{cols}: error {err}");
        }
    }
}

/// Whether `body` (a linearized loop body) contains an EXP2 anywhere.
fn has_exp2(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Loop { body, .. } => has_exp2(body),
        Stmt::Op(u) => matches!(u.op(), Op::Unary(UnaryOp::Exp2)),
    })
}

/// The innermost loops that store to a buffer of `len` elements, and whether one was found.
fn output_loops<'a>(body: &'a [Stmt], len: usize, out: &mut Vec<&'a [Stmt]>) {
    for s in body {
        if let Stmt::Loop { body: inner, .. } = s {
            let stores = inner.iter().any(|s| {
                matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Store)
                    && u.src()[0].src().first().and_then(view_base).is_some_and(|b| matches!(b.op(), Op::Buffer { len: l, .. } if *l == len)))
            });
            if stores {
                out.push(inner);
            }
            output_loops(inner, len, out);
        }
    }
}

#[test]
fn the_gradient_kernel_takes_its_exponentials_from_the_tile_op_and_reads_the_logits_in_place() {
    let (rows, cols) = (64, 32000);
    let x = logits(rows, cols, 5);
    let t = Tensor::from_array(&x);
    let targets: Vec<usize> = (0..rows).map(|i| i * 131 % cols).collect();
    let grad = gradient(&t.cross_entropy(&targets), &[&t]).unwrap().remove(0);
    let plan = make_plan(std::slice::from_ref(grad.uop()), &RealizeOptions::fused()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    let program = &plan.kernels[0].program;
    let nodes = UOp::toposort(std::slice::from_ref(program));
    // the logits: the logits-sized buffer no STORE writes (the other one is the gradient)
    let written: Vec<UOp> = nodes
        .iter()
        .filter(|u| matches!(u.op(), Op::Store))
        .filter_map(|u| u.src()[0].src().first().and_then(view_base).cloned())
        .collect();
    let logits_buffer = |index: &UOp| {
        let base = index.src().first().and_then(view_base);
        base.is_some_and(|b| {
            matches!(b.op(), Op::Buffer { len, .. } if *len == rows * cols) && !written.contains(b)
        })
    };
    let tiles: Vec<(&TileOp, &UOp)> = nodes
        .iter()
        .filter_map(|u| match u.op() {
            Op::Tile(t) => Some((t, u)),
            _ => None,
        })
        .collect();
    let [
        (TileOp::MaxSumExp { rows: task_rows, .. }, sum_op),
        (TileOp::ExpRows { cols: exp_cols, .. }, exp_op),
    ] = tiles[..]
    else {
        panic!("one row tile op and one exp tile op: {tiles:?}");
    };
    assert!(
        logits_buffer(&sum_op.src()[0]) && logits_buffer(&exp_op.src()[0]),
        "both read the logits in place"
    );
    assert_eq!(*exp_cols, cols, "a whole row per call");
    // the task's rows stay in a 1 MiB L2 for their second read
    assert!(task_rows * cols * 4 <= 512 * 1024, "{task_rows} rows per task");
    let loads = nodes.iter().filter(|u| matches!(u.op(), Op::Load) && logits_buffer(&u.src()[0])).count();
    assert_eq!(loads, 0, "nothing but the tile ops reads the logits");
    let lin = linearize(program).unwrap();
    let mut loops = Vec::new();
    output_loops(&lin.root, rows * cols, &mut loops);
    assert_eq!(loops.len(), 1, "one loop writes the gradient");
    assert!(!has_exp2(loops[0]), "the gradient's loop computes no exponential");
}

#[test]
fn bodies_without_a_row_exponential_of_the_reduced_rows_keep_the_loop_exponential() {
    let x = Tensor::from_array(&logits(4, 3000, 9));
    let y = Tensor::from_array(&logits(4, 3000, 10));
    let m = x.max(-1, true);
    let l = ((&x - &m) * LOG2E).exp2().sum(-1, true);
    // a shift that varies along the row: one value per row does not serve it
    let varying = ((&x - &y) * LOG2E).exp2() * l.recip();
    // two exponentials of the rows: the body's loop keeps both
    let two = ((&x - &m) * LOG2E).exp2() * l.recip() + ((&x - 1.0) * LOG2E).exp2();
    // a body of rows (logsumexp) has no elementwise exponential to take
    for (name, t) in
        [("varying shift", varying), ("two exponentials", two), ("logsumexp", x.logsumexp(-1, false))]
    {
        let (sums, exps) = tile_ops(&t);
        assert_eq!((sums.len(), exps.len()), (1, 0), "{name}");
    }
    // the varying shift's values are still right on the path kept
    let (xa, ya) = (logits(4, 3000, 9), logits(4, 3000, 10));
    let varying = ((&x - &y) * LOG2E).exp2() * l.recip();
    let got = varying.realize_with(&RealizeOptions::fused()).unwrap().0.to_ndarray::<f32>().unwrap();
    for ((i, j), &v) in got.clone().into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        let m = xa.row(i).iter().fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        let s: f64 = xa.row(i).iter().map(|&v| (f64::from(v) - m).exp()).sum();
        let want = (f64::from(xa[[i, j]]) - f64::from(ya[[i, j]])).exp() / s;
        let close =
            (f64::from(v) - want).abs() <= 1e-4 * want.abs() || (want.is_infinite() && v.is_infinite());
        assert!(close || (want > 1e30 && f64::from(v) > 1e30) || want < 1e-30, "({i}, {j}): {v} vs {want}");
    }
}

#[test]
fn softmax_over_the_last_of_three_axes_is_right_on_and_off_the_row_tiles() {
    // one row axis of size > 1 takes the tile ops; two go to rangeify's loops (a task's tiles
    // indexed by a quotient and a remainder of its rows would not verify)
    for ((a, b, c), tiled) in [((1, 6, 50), true), ((2, 3, 50), false)] {
        let flat = logits(a * b, c, 11);
        let x = Tensor::from_array(&flat.clone().into_shape_with_order((a, b, c)).unwrap());
        let y = x.softmax(-1);
        let (sums, exps) = tile_ops(&y);
        assert_eq!((sums.len(), exps.len()), if tiled { (1, 1) } else { (0, 0) }, "{a}x{b}x{c}");
        let got = y.realize_with(&RealizeOptions::fused()).unwrap().0.to_ndarray::<f32>().unwrap();
        let got = got.into_shape_with_order((a * b, c)).unwrap();
        for (i, row) in flat.rows().into_iter().enumerate() {
            let m = row.iter().fold(f64::NEG_INFINITY, |acc, &v| acc.max(f64::from(v)));
            let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
            for (j, &v) in row.iter().enumerate() {
                let want = (f64::from(v) - m).exp() / s;
                assert!(
                    (f64::from(got[[i, j]]) - want).abs() < 4e-5,
                    "({i}, {j}): {} vs {want}",
                    got[[i, j]]
                );
            }
        }
    }
}
