//! Online sums over the rows of a loaded input on the logsumexp tile op: the plan's structure
//! (one kernel, the tile op the only reader of the logits, rows on the THREAD axis) and the
//! values of logsumexp, log-softmax, softmax and cross-entropy with its gradient against f64,
//! on the tile path, on rangeify's online loops and as written, with `-inf`, `+inf` and NaN
//! rows and large magnitudes.

use ndarray::{Array2, ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::ir::{Op, TileOp, UOp, linearize, view_base};
use uopc::tensor::{DefaultOpt, Experiments, gradient};
use uopc::{RealizeOptions, Tensor, make_plan};

use crate::common::{accumulators_inside_thread, max_err, realize};

/// The three ways compared: online sums on tile ops (the default fused plan), online sums in
/// rangeify's loops (no tile ops), and the sums as written.
fn forms() -> [(&'static str, RealizeOptions); 3] {
    let written = RealizeOptions::fused()
        .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() });
    [
        ("tile", RealizeOptions::fused()),
        ("loops", RealizeOptions::fused().with_opt(DefaultOpt::loops())),
        ("written", written),
    ]
}

/// Random logits with special rows: row 0 all `-inf` when `rows > 3`, row 1 with a `+inf`,
/// row 2 with a NaN (only when `special`), and rows of large magnitude.
fn logits(rows: usize, cols: usize, seed: u64, special: bool) -> Array2<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut x = Array2::from_shape_fn((rows, cols), |(i, _)| {
        let scale = if i % 2 == 1 { 300.0 } else { 8.0 };
        rng.random_range(-scale..scale)
    });
    if special && rows > 3 {
        x.row_mut(0).fill(f32::NEG_INFINITY);
        x[[1, cols / 2]] = f32::INFINITY;
        x[[2, cols - 1]] = f32::NAN;
    }
    x
}

/// Per row, the graph's finite shift (the maximum, NaN if any, 0 where infinite) and
/// `sum_j exp(x_j - shift)`, in f64.
fn shifted_sums(x: &Array2<f32>) -> Vec<(f64, f64)> {
    x.rows()
        .into_iter()
        .map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| {
                if a.is_nan() || v.is_nan() { f64::NAN } else { a.max(f64::from(v)) }
            });
            // NaN and the infinities are not finite: 0, as `finite_shift` makes them
            let g = if m.is_finite() { m } else { 0.0 };
            (g, row.iter().map(|&v| (f64::from(v) - g).exp()).sum())
        })
        .collect()
}

/// The mean cross-entropy of `x` against `targets` and its gradient `(softmax - one_hot) / n`,
/// in f64.
fn cross_entropy_f64(x: &Array2<f32>, targets: &[usize]) -> (f64, ArrayD<f64>) {
    let (n, c) = x.dim();
    let sums = shifted_sums(x);
    let loss =
        (0..n).map(|i| sums[i].1.ln() + sums[i].0 - f64::from(x[[i, targets[i]]])).sum::<f64>() / n as f64;
    let grad = Array2::from_shape_fn((n, c), |(i, j)| {
        let (g, s) = sums[i];
        let p = (f64::from(x[[i, j]]) - g).exp() / s;
        (p - if j == targets[i] { 1.0 } else { 0.0 }) / n as f64
    })
    .into_dyn();
    (loss, grad)
}

/// torch's `log_softmax` in f64 from [`shifted_sums`]: `(x - shift) - ln(sum)`, and all NaN in
/// a row whose maximum is `+inf` (or NaN).
fn log_softmax_f64(x: &Array2<f32>, sums: &[(f64, f64)]) -> ArrayD<f64> {
    let top: Vec<f64> =
        x.rows().into_iter().map(|r| r.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v.into()))).collect();
    Array2::from_shape_fn(x.dim(), |(i, j)| {
        let (g, s) = sums[i];
        if top[i] == f64::INFINITY { f64::NAN } else { (f64::from(x[[i, j]]) - g) - s.ln() }
    })
    .into_dyn()
}

/// Whether the fused plan of `t` lowers its online sum on the row tile op.
fn on_row_tiles(t: &Tensor) -> bool {
    let plan = make_plan(std::slice::from_ref(t.uop()), &RealizeOptions::fused()).unwrap();
    format!("{plan}").contains("row max and sum of exp")
}

#[test]
fn logsumexp_log_softmax_and_softmax_match_f64_on_every_path() {
    for (k, &(rows, cols)) in [(1, 1), (3, 17), (5, 300), (6, 2049), (4, 5000), (2, 9000)].iter().enumerate()
    {
        let x = logits(rows, cols, 100 + k as u64, true);
        let sums = shifted_sums(&x);
        let t = Tensor::from_array(&x);
        let lse: Vec<f64> = sums.iter().map(|&(g, s)| s.ln() + g).collect();
        let lse_want = ArrayD::from_shape_vec(IxDyn(&[rows]), lse.clone()).unwrap();
        let lsm_want = log_softmax_f64(&x, &sums);
        let sm_want = Array2::from_shape_fn((rows, cols), |(i, j)| {
            // the graph's softmax subtracts the maximum itself (not the finite shift)
            let m = x.row(i).iter().fold(f64::NEG_INFINITY, |a, &v| {
                if a.is_nan() || v.is_nan() { f64::NAN } else { a.max(f64::from(v)) }
            });
            let s: f64 = x.row(i).iter().map(|&v| (f64::from(v) - m).exp()).sum();
            (f64::from(x[[i, j]]) - m).exp() / s
        })
        .into_dyn();
        let cases = [
            ("logsumexp", t.logsumexp(-1, false), lse_want),
            ("log_softmax", t.log_softmax(-1), lsm_want),
            ("softmax", t.softmax(-1), sm_want),
        ];
        for (name, y, want) in &cases {
            assert!(on_row_tiles(y), "{name} {rows}x{cols}: not on the row tile op");
            for (form, opts) in forms() {
                let got = realize(y, &opts);
                // An all -inf row's softmax is 0/0 as written but 0/0 = NaN online too, and the
                // online loop's sum of such a row is 0 where the written one is NaN: compare
                // the rows that have a finite element, and the special rows by their kind.
                let err = max_err(&got, want);
                // f32 exponentials (1.2e-7), f32 sums of up to 9000 terms, magnitudes to 300:
                // 2e-5 of max(|value|, 1) is far below any lost or unscaled term.
                let softmax_dead_row = *name == "softmax" && rows > 3;
                if softmax_dead_row {
                    let live = got.slice(ndarray::s![1.., ..]).to_owned().into_dyn();
                    let want = want.slice(ndarray::s![1.., ..]).to_owned().into_dyn();
                    let err = max_err(&live, &want);
                    assert!(err < 2e-5, "{name} {rows}x{cols} ({form}): error {err}");
                } else {
                    assert!(err < 2e-5, "{name} {rows}x{cols} ({form}): error {err}");
                }
            }
        }
    }
}

#[test]
fn cross_entropy_and_its_gradient_match_f64_with_the_gradient_on_row_tiles() {
    for (k, &(n, c)) in [(1, 3), (4, 37), (8, 3000), (3, 7001)].iter().enumerate() {
        let x = logits(n, c, 200 + k as u64, false);
        let mut rng = StdRng::seed_from_u64(k as u64);
        let targets: Vec<usize> = (0..n).map(|_| rng.random_range(0..c)).collect();
        let (loss_want, grad_want) = cross_entropy_f64(&x, &targets);
        let logits = Tensor::from_array(&x);
        let loss = logits.cross_entropy(&targets);
        let grad = gradient(&loss, &[&logits]).unwrap().remove(0);
        assert!(on_row_tiles(&grad), "{n}x{c}: the gradient is not on the row tile op");
        for (form, opts) in forms() {
            let got = realize(&loss, &opts)[IxDyn(&[])];
            let err = (f64::from(got) - loss_want).abs() / loss_want.abs().max(1.0);
            assert!(err < 2e-5, "loss {n}x{c} ({form}): {got} vs {loss_want}");
            let err = max_err(&realize(&grad, &opts), &grad_want);
            // gradients are at most 1/n; 1e-7 absolute is 1e-6 of a probability's scale at n=8
            assert!(err < 1e-7, "gradient {n}x{c} ({form}): error {err}");
        }
    }
}

#[test]
fn a_long_row_logsumexp_is_one_kernel_whose_tile_op_alone_reads_the_logits() {
    let (rows, cols) = (64, 32000);
    let x = logits(rows, cols, 7, false);
    let lse = Tensor::from_array(&x).logsumexp(-1, false);
    let plan = make_plan(std::slice::from_ref(lse.uop()), &RealizeOptions::fused()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    let program = &plan.kernels[0].program;
    let nodes = UOp::toposort(std::slice::from_ref(program));
    // whether an INDEX node points into the logits
    let logits_buffer = |index: &UOp| {
        let base = index.src().first().and_then(view_base);
        base.is_some_and(|b| matches!(b.op(), Op::Buffer { len, .. } if *len == rows * cols))
    };
    let steps: Vec<&UOp> =
        nodes.iter().filter(|u| matches!(u.op(), Op::Tile(TileOp::MaxSumExp { .. }))).collect();
    assert_eq!(steps.len(), 1, "one tile call per task");
    let Op::Tile(TileOp::MaxSumExp { cols: step_cols, .. }) = steps[0].op() else { unreachable!() };
    assert_eq!(*step_cols, cols, "the whole row in one call");
    assert!(logits_buffer(&steps[0].src()[0]), "the tile op reads the logits");
    let loads = nodes.iter().filter(|u| matches!(u.op(), Op::Load) && logits_buffer(&u.src()[0])).count();
    assert_eq!(loads, 0, "nothing but the tile op reads the logits");
    let lin = linearize(program).unwrap();
    let thread = lin.thread.clone().expect("a THREAD axis");
    assert!(thread.src()[0].const_int().is_some_and(|tasks| tasks > 1 && rows as i64 % tasks == 0));
    assert!(accumulators_inside_thread(program));
    let got = realize(&lse, &RealizeOptions::fused());
    let want: Vec<f64> = shifted_sums(&x).iter().map(|&(g, s)| s.ln() + g).collect();
    let err = max_err(&got, &ArrayD::from_shape_vec(IxDyn(&[rows]), want).unwrap());
    assert!(err < 1e-5, "error {err}");
}

#[test]
fn weighted_sums_and_computed_rows_keep_the_loop_path() {
    let x = Tensor::from_array(&logits(4, 3000, 9, false));
    let v = Tensor::from_array(&logits(3000, 2, 10, false));
    // a softmax-weighted sum: its second online sum has another factor than the exponential
    assert!(!on_row_tiles(&x.softmax(-1).matmul(&v)));
    // the maximum of a computed value: not an input read in place
    assert!(!on_row_tiles(&(&x * &x).logsumexp(-1, false)));
    // the reduced axis is not contiguous in memory
    assert!(!on_row_tiles(&x.logsumexp(0, false)));
    // an output element reads the state of rows other than its own (a task holds its own)
    assert!(!on_row_tiles(&x.softmax(-1).reshape(&[3000, 4]).t()));
}

#[test]
fn a_loss_and_its_gradient_realized_together_read_the_logits_in_one_kernel() {
    let count_row_steps = |program: &UOp| {
        UOp::toposort(std::slice::from_ref(program))
            .iter()
            .filter(|u| matches!(u.op(), Op::Tile(TileOp::MaxSumExp { .. })))
            .count()
    };
    let apart = RealizeOptions::fused()
        .with_experiments(Experiments { separate_row_siblings: true, ..Experiments::default() });
    for (k, &(n, c)) in [(1, 3), (4, 37), (8, 3000), (6, 7001), (64, 32000)].iter().enumerate() {
        let x = logits(n, c, 300 + k as u64, false);
        let mut rng = StdRng::seed_from_u64(40 + k as u64);
        let targets: Vec<usize> = (0..n).map(|_| rng.random_range(0..c)).collect();
        let logits = Tensor::from_array(&x);
        let loss = logits.cross_entropy(&targets);
        let grad = gradient(&loss, &[&logits]).unwrap().remove(0);
        let roots = [loss.uop().clone(), grad.uop().clone()];
        let plan = make_plan(&roots, &RealizeOptions::fused()).unwrap();
        // One kernel computes every row's maximum and sum, and writes both the per-row losses
        // and the gradient from them; the other kernels read n targets' logits and average.
        let readers: Vec<_> = plan.kernels.iter().filter(|k| count_row_steps(&k.program) > 0).collect();
        assert_eq!(readers.len(), 1, "{n}x{c}: {plan}");
        assert_eq!(count_row_steps(&readers[0].program), 1, "{n}x{c}: one row step per task");
        assert_eq!(readers[0].written().len(), 2, "{n}x{c}: {plan}");
        assert!(format!("{plan}").contains("shared by 2 outputs"), "{plan}");
        assert!(accumulators_inside_thread(&readers[0].program));
        // The gradient is written whole by its one kernel, so it is not zeroed first.
        assert!(plan.unzeroed_outputs() >= 1, "{n}x{c}: {plan}");
        let separate = make_plan(&roots, &apart).unwrap();
        let readers = separate.kernels.iter().filter(|k| count_row_steps(&k.program) > 0).count();
        assert_eq!(readers, 2, "{n}x{c}: apart, each kernel reads the rows: {separate}");
        // Against f64, and bit for bit against the kernels apart: each row's state and each
        // output element is computed the same way in both.
        let (loss_want, grad_want) = cross_entropy_f64(&x, &targets);
        let realize_both = |opts: &RealizeOptions| {
            let (out, _) = uopc::tensor::realize(&[&loss, &grad], opts).unwrap();
            (out[0].to_ndarray::<f32>().unwrap(), out[1].to_ndarray::<f32>().unwrap())
        };
        let (got_loss, got_grad) = realize_both(&RealizeOptions::fused());
        let got = f64::from(got_loss[IxDyn(&[])]);
        assert!(
            (got - loss_want).abs() / loss_want.abs().max(1.0) < 2e-5,
            "loss {n}x{c}: {got} vs {loss_want}"
        );
        // gradients are at most 1/n; 1e-7 absolute is 1e-6 of a probability's scale at n=8
        let err = max_err(&got_grad, &grad_want);
        assert!(err < 1e-7, "gradient {n}x{c}: error {err}");
        let (apart_loss, apart_grad) = realize_both(&apart);
        assert_eq!(got_loss, apart_loss, "{n}x{c}: the loss");
        assert!(
            got_grad.iter().zip(&apart_grad).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{n}x{c}: the gradient"
        );
    }
}

#[test]
fn row_kernels_join_only_within_one_group() {
    let (xa, ya) = (logits(6, 700, 21, true), logits(6, 700, 22, false));
    let (x, y) = (Tensor::from_array(&xa), Tensor::from_array(&ya));
    // x's logsumexp and log-softmax read one group; y's logsumexp reads other rows
    let (lse_x, lse_y, lsm_x) = (x.logsumexp(-1, false), y.logsumexp(-1, false), x.log_softmax(-1));
    let roots = [lse_x.uop().clone(), lse_y.uop().clone(), lsm_x.uop().clone()];
    let plan = make_plan(&roots, &RealizeOptions::fused()).unwrap();
    assert_eq!(plan.kernels.len(), 2, "{plan}");
    let written: Vec<Vec<uopc::tensor::ArgSource>> =
        plan.kernels.iter().map(|k| k.written().to_vec()).collect();
    use uopc::tensor::ArgSource::Output;
    assert_eq!(written, [vec![Output(0), Output(2)], vec![Output(1)]], "{plan}");
    for k in &plan.kernels {
        assert!(k.written().iter().all(|w| !k.read().contains(w)), "a kernel reads what it writes: {plan}");
    }
    let (out, _) = uopc::tensor::realize(&[&lse_x, &lse_y, &lsm_x], &RealizeOptions::fused()).unwrap();
    for (got, a, log_softmax) in [(&out[0], &xa, false), (&out[1], &ya, false), (&out[2], &xa, true)] {
        let sums = shifted_sums(a);
        let want = if log_softmax {
            log_softmax_f64(a, &sums)
        } else {
            ArrayD::from_shape_vec(IxDyn(&[a.nrows()]), sums.iter().map(|&(g, s)| s.ln() + g).collect())
                .unwrap()
        };
        let err = max_err(&got.to_ndarray::<f32>().unwrap(), &want);
        assert!(err < 2e-5, "error {err}");
    }
}

#[test]
fn few_long_rows_are_split_across_tasks_and_merged() {
    let mut cases: Vec<(&str, Array2<f32>)> = vec![
        ("one row", logits(1, 1 << 18, 41, false)),
        ("two rows", logits(2, 300_000, 42, false)),
        ("three rows", logits(3, 1 << 17, 43, false)),
    ];
    // the maximum in the last chunk only: every earlier chunk's sum is rescaled by the merge
    let mut late = Array2::from_elem((1, 1 << 16), -3.0f32);
    late[[0, (1 << 16) - 5]] = 40.0;
    cases.push(("late maximum", late));
    // whole chunks of -inf weigh nothing; a row of -inf, a +inf and a NaN keep their kinds
    let mut masked = logits(1, 1 << 16, 44, false);
    masked.slice_mut(ndarray::s![0, ..40_000]).fill(f32::NEG_INFINITY);
    cases.push(("-inf chunks", masked));
    cases.push(("-inf row", Array2::from_elem((1, 1 << 16), f32::NEG_INFINITY)));
    let mut inf = logits(1, 1 << 16, 45, false);
    inf[[0, 100]] = f32::INFINITY;
    cases.push(("+inf", inf));
    let mut nan = logits(1, 1 << 16, 46, false);
    nan[[0, 60_000]] = f32::NAN;
    cases.push(("NaN", nan));
    for (name, x) in &cases {
        let rows = x.nrows();
        let t = Tensor::from_array(x);
        let sums = shifted_sums(x);
        let lse_want =
            ArrayD::from_shape_vec(IxDyn(&[rows]), sums.iter().map(|&(g, s)| s.ln() + g).collect()).unwrap();
        let lsm_want = log_softmax_f64(x, &sums);
        for (what, y, want) in
            [("logsumexp", t.logsumexp(-1, false), &lse_want), ("log_softmax", t.log_softmax(-1), &lsm_want)]
        {
            let plan = make_plan(std::slice::from_ref(y.uop()), &RealizeOptions::fused()).unwrap();
            // the chunks' states, then the merge and the body
            assert_eq!(plan.kernels.len(), 2, "{name} {what}: {plan}");
            assert!(plan.kernels[0].name.ends_with("_chunks"), "{plan}");
            assert!(format!("{plan}").contains("merged from chunks"), "{plan}");
            let tasks = |k: usize| {
                let lin = linearize(&plan.kernels[k].program).unwrap();
                lin.thread.and_then(|t| t.src()[0].const_int()).unwrap_or(1) as usize
            };
            assert!(
                tasks(0) > rows && tasks(0) % rows == 0,
                "{name} {what}: {} tasks for {rows} rows",
                tasks(0)
            );
            if what == "log_softmax" {
                assert_eq!(tasks(1), tasks(0), "{name}: the elementwise body takes the chunks too");
            }
            for k in &plan.kernels {
                assert!(accumulators_inside_thread(&k.program), "{name} {what}: {}", k.name);
            }
            let got = realize(&y, &RealizeOptions::fused());
            // f32 sums over up to 300000 terms, in chunks of 2048 merged in order
            let err = max_err(&got, want);
            assert!(err < 5e-5, "{name} {what}: error {err}");
            // and the split form agrees with rangeify's loops, which never split
            let loops = realize(&y, &RealizeOptions::fused().with_opt(DefaultOpt::loops()));
            let err = max_err(&got, &loops.mapv(f64::from));
            assert!(err < 5e-5, "{name} {what}: split against loops {err}");
        }
    }
}
