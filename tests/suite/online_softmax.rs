//! The online-reduction rewrite: which graphs it rewrites and which it refuses, values of the
//! rewritten plans against f64 references (random graphs, late maxima, masked and fully
//! masked rows), and the structure of fully fused attention after it.

use ndarray::{Array2, ArrayD, Axis, IxDyn};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::ir::{Op, Stmt, TileOp, UOp, linearize, view_base};
use uopc::tensor::{Experiments, canonicalize, input_products, online_reductions, static_flops};
use uopc::{RealizeOptions, Tensor, make_plan};

use crate::common::{accumulators_inside_thread, max_err, realize};

fn written() -> RealizeOptions {
    RealizeOptions::fused()
        .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() })
}

/// The online sums `online_reductions` makes of `t`'s graph.
fn online_sums(t: &Tensor) -> usize {
    // realize rewrites the canonical graph (DETACH removed)
    let (canonical, _) = canonicalize(std::slice::from_ref(t.uop()));
    let rewritten = online_reductions(&canonical);
    UOp::toposort(&rewritten)
        .iter()
        .filter(|u| matches!(u.op(), Op::Reduce { .. }) && u.src().len() == 4)
        .count()
}

fn random(rows: usize, cols: usize, scale: f32, seed: u64) -> Array2<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || rng.random_range(-scale..scale))
}

/// Softmax of each row in f64, NaN for a row without a finite entry (as the graph gives).
fn softmax_f64(x: &Array2<f64>) -> Array2<f64> {
    let mut out = x.clone();
    for mut row in out.rows_mut() {
        let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row.mapv_inplace(|v| v / s);
    }
    out
}

/// logsumexp of each row in f64 (`-inf` for a row of `-inf`).
fn logsumexp_f64(x: &Array2<f64>) -> Vec<f64> {
    x.rows()
        .into_iter()
        .map(|row| {
            let m = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            if !m.is_finite() {
                return m;
            }
            m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        })
        .collect()
}

fn to_f64(a: &Array2<f32>) -> Array2<f64> {
    a.mapv(f64::from)
}

/// The factors of the softmax updates in `program`, and how many plain stores write the score
/// tile they read (a pass of its own over each block's scores).
fn update_factors_and_score_stores(program: &UOp) -> (Vec<f32>, usize) {
    let nodes = UOp::toposort(std::slice::from_ref(program));
    let updates: Vec<&UOp> =
        nodes.iter().filter(|u| matches!(u.op(), Op::Tile(TileOp::SoftmaxUpdate { .. }))).collect();
    let factors = updates
        .iter()
        .map(|u| match u.op() {
            Op::Tile(TileOp::SoftmaxUpdate { scale, .. }) => f32::from_bits(*scale),
            _ => unreachable!(),
        })
        .collect();
    let score_tiles: Vec<&UOp> = updates.iter().filter_map(|u| view_base(&u.src()[0].src()[0])).collect();
    let stores = nodes
        .iter()
        .filter(|u| matches!(u.op(), Op::Store))
        .filter(|u| view_base(&u.src()[0].src()[0]).is_some_and(|b| score_tiles.contains(&b)))
        .count();
    (factors, stores)
}

#[test]
fn softmax_family_sums_become_online() {
    let x = Tensor::from_array(&random(4, 33, 3.0, 1));
    let v = Tensor::from_array(&random(33, 5, 1.0, 2));
    // softmax: its normalizer
    assert_eq!(online_sums(&x.softmax(-1)), 1);
    // softmax-weighted sum: the normalizer and P.V (once the division is hoisted)
    assert_eq!(online_sums(&x.softmax(-1).matmul(&v)), 2);
    assert_eq!(online_sums(&x.logsumexp(-1, false)), 1);
    assert_eq!(online_sums(&x.log_softmax(-1)), 1);
    assert_eq!(online_sums(&x.cross_entropy(&[0, 5, 32, 7])), 1);
}

#[test]
fn sums_without_a_rescaling_law_are_left_as_written() {
    let x = Tensor::from_array(&random(4, 9, 2.0, 3));
    let m = x.max(-1, true);
    // the maximum enters additively: no rescaling law
    let additive = (&x - &m).sum(-1, false);
    // a second factor reads the maximum too (an entropy-like sum)
    let p = (&x - &m).exp();
    let entropy = (&p * &(&x - &m)).sum(-1, false);
    // a maximum over the other axis varies along the summed one
    let other_axis = (&x - &x.max(0, true)).exp().sum(-1, false);
    for (name, t) in [("additive", &additive), ("entropy", &entropy), ("other axis", &other_axis)] {
        assert_eq!(online_sums(t), 0, "{name}");
    }
    // and each still computes what it says
    let xs = to_f64(&random(4, 9, 2.0, 3));
    let rowmax: Vec<f64> =
        xs.rows().into_iter().map(|r| r.fold(f64::NEG_INFINITY, |a, &b| a.max(b))).collect();
    let want: Vec<f64> = xs
        .rows()
        .into_iter()
        .zip(&rowmax)
        .map(|(r, &m)| r.iter().map(|&v| (v - m).exp() * (v - m)).sum())
        .collect();
    let got = realize(&entropy, &RealizeOptions::fused());
    let want = ArrayD::from_shape_vec(IxDyn(&[4]), want).unwrap();
    assert!(max_err(&got, &want) < 1e-5);
}

/// Every row ascending: each key is a new maximum, so every accumulator must be rescaled at
/// every step. An accumulator left unrescaled keeps weights `exp(x_j - m_j)` of about 1 for
/// every earlier key and is off by far more than the tolerance.
#[test]
fn late_maxima_rescale_every_dependent_accumulator() {
    let (n, d) = (48, 24);
    let mut x = random(6, n, 4.0, 4);
    for mut row in x.rows_mut() {
        let mut v: Vec<f32> = row.to_vec();
        v.sort_by(f32::total_cmp);
        row.assign(&ndarray::ArrayView1::from(&v[..]));
    }
    let v = random(n, d, 1.0, 5);
    let out = Tensor::from_array(&x).softmax(-1).matmul(&Tensor::from_array(&v));
    let want = softmax_f64(&to_f64(&x)).dot(&to_f64(&v)).into_dyn();
    for opts in [RealizeOptions::fused(), written(), RealizeOptions::default()] {
        let err = max_err(&realize(&out, &opts), &want);
        // f32 sums of 48 terms of O(1): about 1e-6
        assert!(err < 2e-5, "error {err}");
    }
    let lse = Tensor::from_array(&x).logsumexp(-1, false);
    let want = ArrayD::from_shape_vec(IxDyn(&[6]), logsumexp_f64(&to_f64(&x))).unwrap();
    assert!(max_err(&realize(&lse, &RealizeOptions::fused()), &want) < 1e-5);
}

/// One random consumer of a max-subtracted sum over rows that may hold `-inf` (masked keys),
/// including rows that are fully masked.
fn random_case(seed: u64) -> (String, Tensor, ArrayD<f64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let rows = rng.random_range(1..6usize);
    let cols = rng.random_range(1..70usize);
    let scale = [0.5f32, 4.0, 60.0][rng.random_range(0..3usize)];
    let mut x = random(rows, cols, scale, seed ^ 0xabc);
    let masked = rng.random_bool(0.5);
    if masked {
        for (i, mut row) in x.rows_mut().into_iter().enumerate() {
            let full = i == 0 && rng.random_bool(0.5);
            for v in row.iter_mut() {
                if full || rng.random_bool(0.3) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
    let xs = to_f64(&x);
    let t = Tensor::from_array(&x);
    let kind = rng.random_range(0..5usize);
    let name = format!("seed {seed}: {rows}x{cols} scale {scale} masked {masked} kind {kind}");
    match kind {
        0 => (name, t.softmax(-1), softmax_f64(&xs).into_dyn()),
        1 => {
            let lse = ArrayD::from_shape_vec(IxDyn(&[rows]), logsumexp_f64(&xs)).unwrap();
            (name, t.logsumexp(-1, false), lse)
        }
        2 => {
            let lse = logsumexp_f64(&xs);
            let mut want = xs.clone();
            for (mut row, l) in want.rows_mut().into_iter().zip(lse) {
                row.mapv_inplace(|v| if l.is_finite() { v - l } else { f64::NAN });
            }
            let want = want.mapv(|v| if v.is_nan() { f64::NAN } else { v });
            // a fully masked row: x - m is -inf - 0 = -inf, minus log 0 = -inf: NaN
            (name, t.log_softmax(-1), want.into_dyn())
        }
        3 => {
            let w = random(cols, 3, 1.0, seed ^ 0x77);
            let want = softmax_f64(&xs).dot(&to_f64(&w)).into_dyn();
            (name, t.softmax(-1).matmul(&Tensor::from_array(&w)), want)
        }
        _ => {
            let v = random(rows, cols, 1.0, seed ^ 0x99);
            // softmax times a value of the same shape, summed: a weighted row mean
            let p = softmax_f64(&xs);
            let want: Vec<f64> =
                (0..rows).map(|i| (0..cols).map(|j| p[[i, j]] * f64::from(v[[i, j]])).sum()).collect();
            let want = ArrayD::from_shape_vec(IxDyn(&[rows]), want).unwrap();
            (name, (&t.softmax(-1) * &Tensor::from_array(&v)).sum(-1, false), want)
        }
    }
}

#[test]
fn random_softmax_graphs_match_f64_with_and_without_the_rewrite() {
    let cases: u64 =
        std::env::var("UOPC_GRAPH_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(200).min(400);
    let mut rewritten = 0;
    for seed in 0..cases {
        let (name, t, want) = random_case(seed);
        rewritten += usize::from(online_sums(&t) > 0);
        for (label, opts) in [("online", RealizeOptions::fused()), ("written", written())] {
            let err = max_err(&realize(&t, &opts), &want);
            // relative to max(|value|, 1); f32 sums of at most 70 terms, exponents up to 120
            assert!(err < 1e-4, "{name} ({label}): error {err}");
        }
    }
    assert_eq!(rewritten as u64, cases, "every case has a sum the rewrite takes");
}

#[test]
fn cross_entropy_gradient_through_online_sums_matches_f64() {
    let (n, c) = (5, 37);
    let x = random(n, c, 6.0, 9);
    let targets = [3usize, 0, 36, 17, 17];
    let logits = Tensor::from_array(&x);
    let loss = logits.cross_entropy(&targets);
    let grad = uopc::tensor::gradient(&loss, &[&logits]).unwrap().remove(0);
    let mut want = softmax_f64(&to_f64(&x));
    for (i, &t) in targets.iter().enumerate() {
        want[[i, t]] -= 1.0;
    }
    let want = (want / n as f64).into_dyn();
    assert!(online_sums(&grad) >= 1);
    let err = max_err(&realize(&grad, &RealizeOptions::fused()), &want);
    assert!(err < 1e-6, "error {err}");
}

#[test]
fn fused_attention_is_one_pass_over_the_keys() {
    let (n, d) = (256, 64);
    let q = Tensor::from_array(&random(n, d, 1.0, 11));
    let k = Tensor::from_array(&random(n, d, 1.0, 12));
    let v = Tensor::from_array(&random(n, d, 1.0, 13));
    let out = uopc::attention::attention(&q, &k, &v);
    let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert!(plan.kernels[0].uses_tile_ops(), "score and P.V products on tile GEMMs: {plan}");
    // the plan says what was derived
    assert!(plan.to_string().contains("[2 online sums on tile ops"), "{plan}");
    assert!(plan.temp_sizes().iter().all(|&t| t < n * n), "no N x N buffer: {plan}");
    assert_eq!(input_products(&plan, 0, 1).unwrap(), (n * n * d) as u64, "q.k once per (query, key) pair");
    assert!(accumulators_inside_thread(&plan.kernels[0].program));
    // the 1/sqrt(D) of the scores is the update's factor (with the base-2 one): no pass of its
    // own over each block's scores
    let (factors, score_stores) = update_factors_and_score_stores(&plan.kernels[0].program);
    let want = (0.125 * std::f64::consts::LOG2_E) as f32;
    assert!(factors.iter().all(|&f| f == want) && !factors.is_empty(), "{factors:?}");
    assert_eq!(score_stores, 0, "the scores are scaled where the update reads them");
    // the rewritten plan does the work of the hand-written FlashAttention-2 kernel
    let derived = static_flops(&plan.kernels[0].program).unwrap() as f64;
    let tiling = uopc::flash_tiled::TILE_OPS_TILING;
    let hand = static_flops(&uopc::flash_tiled::flash_tile_ops_ir(n, d, tiling)).unwrap() as f64;
    assert!((derived / hand - 1.0).abs() < 0.10, "static FLOPs {derived} against the hand-written {hand}");
    // the written form: QK^T once per pass
    let plan = make_plan(std::slice::from_ref(out.uop()), &written()).unwrap();
    assert_eq!(input_products(&plan, 0, 1).unwrap(), 6 * (n * n * d) as u64);
}

#[test]
fn fused_batched_masked_attention_matches_the_unfused_plan() {
    let shape = [2usize, 3, 40, 16];
    let mk = |seed: u64| {
        let mut rng = StdRng::seed_from_u64(seed);
        ArrayD::from_shape_simple_fn(IxDyn(&shape), || rng.random_range(-1.0f32..1.0))
    };
    let (q, k, v) = (Tensor::from_array(&mk(21)), Tensor::from_array(&mk(22)), Tensor::from_array(&mk(23)));
    // a mask with one fully masked query row per head
    let mut mask = ArrayD::from_shape_simple_fn(IxDyn(&[40, 40]), || 1.0f32);
    mask.index_axis_mut(Axis(0), 5).fill(0.0);
    let mask = Tensor::from_array(&mask);
    for causal in [false, true] {
        let out = uopc::tensor::masked::attention_masked(&q, &k, &v, Some(&mask), causal);
        let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
        // the mask is applied to each score tile, the row indicator when the output is stored
        assert!(plan.kernels.iter().any(|k| k.uses_tile_ops()), "causal {causal}: {plan}");
        let unfused = realize(&out, &RealizeOptions::default()).mapv(f64::from);
        let fused = realize(&out, &RealizeOptions::fused());
        assert!(max_err(&fused, &unfused) < 1e-5, "causal {causal}");
        // the fully masked row gives zeros
        assert!(fused.index_axis(Axis(2), 5).iter().all(|&x| x == 0.0));
    }
}

/// `softmax(q k^T / sqrt(d)) v` per leading index of `(.., n, d)` arrays, in f64.
fn attention_f64(q: &ArrayD<f32>, k: &ArrayD<f32>, v: &ArrayD<f32>) -> ArrayD<f64> {
    let r = q.ndim();
    let (n_q, d) = (q.shape()[r - 2], q.shape()[r - 1]);
    let (n_k, dv) = (k.shape()[r - 2], v.shape()[r - 1]);
    let lead: usize = q.shape()[..r - 2].iter().product();
    let flat = |a: &ArrayD<f32>, rows: usize, cols: usize| {
        a.as_standard_layout().to_owned().into_shape_with_order((lead, rows, cols)).unwrap().mapv(f64::from)
    };
    let (q3, k3, v3) = (flat(q, n_q, d), flat(k, n_k, d), flat(v, n_k, dv));
    let mut out = ndarray::Array3::<f64>::zeros((lead, n_q, dv));
    for b in 0..lead {
        let s = q3.index_axis(Axis(0), b).dot(&k3.index_axis(Axis(0), b).t()) / (d as f64).sqrt();
        let p = softmax_f64(&s);
        out.index_axis_mut(Axis(0), b).assign(&p.dot(&v3.index_axis(Axis(0), b)));
    }
    let mut shape = q.shape()[..r - 1].to_vec();
    shape.push(dv);
    out.into_shape_with_order(IxDyn(&shape)).unwrap()
}

#[test]
fn fused_attention_on_tile_ops_matches_f64_for_every_shape() {
    let mk = |shape: &[usize], seed: u64| {
        let mut rng = StdRng::seed_from_u64(seed);
        ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.random_range(-1.5f32..1.5))
    };
    // (batch, heads, n_q, n_k, d): a key count that leaves a partial key block, n_q != n_k,
    // one query (decode), head sizes off the SIMD width
    for (i, &(b, h, n_q, n_k, d)) in [
        (1, 1, 64, 64, 16),
        (2, 3, 40, 130, 24),
        (1, 2, 256, 256, 64),
        (1, 4, 1, 300, 32),
        (1, 1, 96, 200, 7),
        (1, 8, 256, 256, 128),
    ]
    .iter()
    .enumerate()
    {
        let seed = 100 + 3 * i as u64;
        let (q, k, v) =
            (mk(&[b, h, n_q, d], seed), mk(&[b, h, n_k, d], seed + 1), mk(&[b, h, n_k, d], seed + 2));
        let want = attention_f64(&q, &k, &v);
        let out = uopc::tensor::masked::attention_masked(
            &Tensor::from_array(&q),
            &Tensor::from_array(&k),
            &Tensor::from_array(&v),
            None,
            false,
        );
        let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
        assert!(plan.kernels.len() == 1 && plan.kernels[0].uses_tile_ops(), "{plan}");
        // f32 scores and sums over at most 300 keys of O(1) terms
        let err = max_err(&realize(&out, &RealizeOptions::fused()), &want);
        assert!(err < 2e-5, "({b}, {h}, {n_q}, {n_k}, {d}): error {err}");
    }
    // heads read in place from the (B, N, H, D) layout a fused projection writes
    let (b, n, h, d) = (2, 48, 3, 16);
    let x = [mk(&[b, n, h, d], 1), mk(&[b, n, h, d], 2), mk(&[b, n, h, d], 3)];
    let heads = |a: &ArrayD<f32>| a.view().permuted_axes(IxDyn(&[0, 2, 1, 3])).to_owned();
    let want = attention_f64(&heads(&x[0]), &heads(&x[1]), &heads(&x[2]));
    let t = |a: &ArrayD<f32>| Tensor::from_array(a).permute(&[0, 2, 1, 3]);
    let out = uopc::tensor::masked::attention_masked(&t(&x[0]), &t(&x[1]), &t(&x[2]), None, false);
    let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
    assert!(
        plan.kernels.len() == 1 && plan.kernels[0].uses_tile_ops(),
        "strided heads read in place: {plan}"
    );
    assert!(max_err(&realize(&out, &RealizeOptions::fused()), &want) < 2e-5);
}

#[test]
fn masks_and_biases_written_in_the_graph_go_through_the_tile_path() {
    let (n_q, n_k, d) = (48, 72, 16);
    let q = Tensor::from_array(&random(n_q, d, 1.0, 31));
    let k = Tensor::from_array(&random(n_k, d, 1.0, 32));
    let v = Tensor::from_array(&random(n_k, d, 1.0, 33));
    let bias = random(n_q, n_k, 2.0, 34);
    let mut keep = vec![true; n_q * n_k];
    for (i, x) in keep.iter_mut().enumerate() {
        // row 7 sees no key; elsewhere every third key is hidden
        *x = i / n_k != 7 && i % 3 != 0;
    }
    let keep = Tensor::from_vec(keep, &[n_q, n_k]);
    let scores = q.matmul(&k.transpose(0, 1)) * 0.25;
    let biased = &scores + &Tensor::from_array(&bias);
    let masked = keep.where_(&scores, &Tensor::full(&[], f32::NEG_INFINITY));
    // a negative factor turns the order of the scores around: it cannot be the update's
    let negative = q.matmul(&k.transpose(0, 1)) * -0.25;
    for (name, s) in [("bias", biased), ("-inf mask", masked), ("negative scale", negative)] {
        let out = s.softmax(-1).matmul(&v);
        let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
        assert!(plan.kernels.len() == 1 && plan.kernels[0].uses_tile_ops(), "{name}: {plan}");
        let (factors, score_stores) = update_factors_and_score_stores(&plan.kernels[0].program);
        assert!(factors.iter().all(|&f| f == 1.0) && score_stores > 0, "{name}: evaluated on the tile first");
        let unfused = realize(&out, &RealizeOptions::default()).mapv(f64::from);
        let fused = realize(&out, &RealizeOptions::fused());
        // the row that sees no key is NaN in both (0 / 0), as the graph says
        assert!(max_err(&fused, &unfused) < 1e-5, "{name}");
    }
}

#[test]
fn long_rows_are_taken_in_blocks_and_stay_exact() {
    // 4096 columns: blocks of 512, a block maximum and a block sum per block
    let (rows, cols) = (3, 4096);
    let mut x = random(rows, cols, 30.0, 41);
    // the maximum of row 1 in its last block, row 2 ascending (a new maximum in every block),
    // a masked stretch in row 0
    x[[1, cols - 3]] = 200.0;
    let mut asc: Vec<f32> = x.row(2).to_vec();
    asc.sort_by(f32::total_cmp);
    x.row_mut(2).assign(&ndarray::ArrayView1::from(&asc[..]));
    for j in 0..1500 {
        x[[0, j]] = f32::NEG_INFINITY;
    }
    let t = Tensor::from_array(&x);
    let want = ArrayD::from_shape_vec(IxDyn(&[rows]), logsumexp_f64(&to_f64(&x))).unwrap();
    // without tile ops: with them, a logsumexp of an input's rows is the row tile op's
    // (tests/suite/online_rows.rs)
    let loops = RealizeOptions::fused().with_opt(uopc::tensor::DefaultOpt::loops());
    let plan = make_plan(std::slice::from_ref(t.logsumexp(-1, false).uop()), &loops).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    // a loop over the 8 blocks holding the loops over a block's 512 columns
    fn trips(body: &[Stmt], outer: Option<i64>, found: &mut bool) {
        for s in body {
            if let Stmt::Loop { range, body } = s {
                let trip = range.src()[0].const_int();
                *found |= outer == Some(8) && trip == Some(512);
                trips(body, trip, found);
            }
        }
    }
    let mut blocked = false;
    trips(&linearize(&plan.kernels[0].program).unwrap().root, None, &mut blocked);
    assert!(blocked, "no loop over blocks of 512");
    for opts in [loops, RealizeOptions::fused()] {
        let err = max_err(&realize(&t.logsumexp(-1, false), &opts), &want);
        assert!(err < 1e-5, "logsumexp error {err}");
    }
    let v = random(cols, 2, 1.0, 42);
    let want = softmax_f64(&to_f64(&x)).dot(&to_f64(&v)).into_dyn();
    let err =
        max_err(&realize(&t.softmax(-1).matmul(&Tensor::from_array(&v)), &RealizeOptions::fused()), &want);
    assert!(err < 1e-5, "softmax . v error {err}");
}

/// Causal `softmax(q k^T / sqrt(d)) v` per leading index of `(.., n, d)` arrays in f64, with
/// queries aligned to the end of the keys and a row that sees no key giving zeros.
fn causal_attention_f64(
    q: &ArrayD<f32>,
    k: &ArrayD<f32>,
    v: &ArrayD<f32>,
    window: Option<usize>,
) -> ArrayD<f64> {
    let r = q.ndim();
    let (n_q, d, n_k, dv) = (q.shape()[r - 2], q.shape()[r - 1], k.shape()[r - 2], v.shape()[r - 1]);
    let lead: usize = q.shape()[..r - 2].iter().product();
    let flat = |a: &ArrayD<f32>, rows: usize, cols: usize| {
        a.as_standard_layout().to_owned().into_shape_with_order((lead, rows, cols)).unwrap().mapv(f64::from)
    };
    let (q3, k3, v3) = (flat(q, n_q, d), flat(k, n_k, d), flat(v, n_k, dv));
    let mut out = ndarray::Array3::<f64>::zeros((lead, n_q, dv));
    for b in 0..lead {
        for i in 0..n_q {
            let last = i as i64 + n_k as i64 - n_q as i64;
            let first = window.map_or(0, |w| last - w as i64 + 1);
            let seen: Vec<usize> = (0..n_k).filter(|&j| (j as i64) <= last && j as i64 >= first).collect();
            let s: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    q3.slice(ndarray::s![b, i, ..]).dot(&k3.slice(ndarray::s![b, j, ..])) / (d as f64).sqrt()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (&j, x) in seen.iter().zip(&s) {
                let p = (x - m).exp() / total;
                out.slice_mut(ndarray::s![b, i, ..]).scaled_add(p, &v3.slice(ndarray::s![b, j, ..]));
            }
        }
    }
    let mut shape = q.shape()[..r - 1].to_vec();
    shape.push(dv);
    out.into_shape_with_order(IxDyn(&shape)).unwrap()
}

/// Whether the loop over key blocks of the fused kernel ends at an expression of the THREAD
/// index (blocks past the task's last visible key skipped) rather than at a constant.
fn key_loop_ends_with_the_task(program: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(program)).iter().any(|u| {
        matches!(u.op(), Op::Range { axis: uopc::ir::AxisType::Reduce, .. })
            && u.src()[0].const_int().is_none()
    })
}

#[test]
fn fused_causal_attention_skips_the_key_blocks_past_the_diagonal() {
    let mk = |shape: &[usize], seed: u64| {
        let mut rng = StdRng::seed_from_u64(seed);
        ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.random_range(-1.5f32..1.5))
    };
    // (batch, heads, n_q, n_k, d): square, fewer queries than keys with a partial last key
    // block, more queries than keys (the first rows see no key)
    for (i, &(b, h, n_q, n_k, d)) in
        [(1, 2, 512, 512, 32), (2, 1, 200, 456, 16), (1, 1, 300, 140, 16)].iter().enumerate()
    {
        let seed = 200 + 3 * i as u64;
        let (q, k, v) =
            (mk(&[b, h, n_q, d], seed), mk(&[b, h, n_k, d], seed + 1), mk(&[b, h, n_k, d], seed + 2));
        let t = |a: &ArrayD<f32>| Tensor::from_array(a);
        let out = uopc::tensor::masked::attention_masked(&t(&q), &t(&k), &t(&v), None, true);
        let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
        assert!(plan.kernels.len() == 1 && plan.kernels[0].uses_tile_ops(), "{plan}");
        let program = &plan.kernels[0].program;
        assert!(key_loop_ends_with_the_task(program), "({n_q}, {n_k}): no key block skipped\n{plan}");
        if n_q <= n_k {
            // the mask became loop bounds: no per-element select is left
            let selects = UOp::toposort(std::slice::from_ref(program))
                .iter()
                .filter(|u| matches!(u.op(), Op::Where))
                .count();
            assert_eq!(selects, 0, "({n_q}, {n_k}): the causal mask is evaluated per element");
        }
        let err = max_err(&realize(&out, &RealizeOptions::fused()), &causal_attention_f64(&q, &k, &v, None));
        assert!(err < 2e-5, "({b}, {h}, {n_q}, {n_k}, {d}): error {err}");
    }
    // a sliding window of 100 keys written in the graph: the end is read off the causal
    // half, the window's start is left to the per-element mask
    let (n, d) = (384, 16);
    let (q, k, v) = (mk(&[1, 1, n, d], 1), mk(&[1, 1, n, d], 2), mk(&[1, 1, n, d], 3));
    let pos = |len: usize, shape: &[usize]| Tensor::arange(len).reshape(shape);
    let int = |v: f32| Tensor::full(&[], v).cast(uopc::ir::DType::I64);
    // i - j, an i64 tensor: key j is seen when 0 <= i - j < 100
    let ahead = &pos(n, &[n, 1]) - &pos(n, &[1, n]);
    let keep = ahead
        .lt(&int(100.0))
        .where_(&ahead.ge(&int(0.0)), &Tensor::full(&[], 0.0).cast(uopc::ir::DType::Bool));
    let qt = Tensor::from_array(&q);
    let scores = qt.matmul(&Tensor::from_array(&k).transpose(-2, -1)) * 0.25;
    let out = keep
        .where_(&scores, &Tensor::full(&[], f32::NEG_INFINITY))
        .softmax(-1)
        .matmul(&Tensor::from_array(&v));
    let plan = make_plan(std::slice::from_ref(out.uop()), &RealizeOptions::fused()).unwrap();
    assert!(plan.kernels.len() == 1 && key_loop_ends_with_the_task(&plan.kernels[0].program), "{plan}");
    let err = max_err(&realize(&out, &RealizeOptions::fused()), &causal_attention_f64(&q, &k, &v, Some(100)));
    assert!(err < 2e-5, "sliding window: error {err}");
}
