//! GEMM epilogues: elementwise consumers of a tile GEMM (bias, GELU, residual, scale, the
//! rounding cast of a bf16 matmul) fuse into the GEMM's kernel, which the plan shows; values
//! against f64 references; consumers that need other elements of the GEMM output do not fuse
//! and stay right.

use crate::common::*;
use half::bf16;
use ndarray::{ArrayD, IxDyn};
use uopc_ir::{DType, Op};
use uopc_tensor::*;

/// `a @ b` in f64 for 2-D row-major arrays.
fn matmul64(a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
    let (n, k, m) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            out[i * m + j] = (0..k).map(|p| a[[i, p]] * b[[p, j]]).sum();
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[n, m]), out).unwrap()
}

/// GELU with the tanh approximation, in f64.
fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn plan_of(t: &Tensor) -> std::sync::Arc<Plan> {
    make_plan(&[t.uop().clone()], &RealizeOptions::default()).expect("plans")
}

/// The kernels of `plan` that are tile GEMMs, by name, each with whether it has an epilogue.
fn gemms(plan: &Plan) -> Vec<(String, bool)> {
    // A kernel of other tile ops (a row conversion) is not a GEMM.
    let gemm = |k: &&Kernel| k.uses_tile_ops() && k.kind_label().contains("gemm");
    plan.kernels.iter().filter(gemm).map(|k| (k.name.clone(), k.has_epilogue())).collect()
}

/// Whether kernel `k`'s THREAD tasks are proven to write disjoint memory, so they run in
/// parallel (a kernel of one task counts as parallel).
fn runs_in_parallel(k: &Kernel) -> bool {
    let prepared = uopc_ir::prepare(&k.program, &uopc_ir::PrepareOptions::default()).expect("prepares");
    prepared.thread.is_none_or(|t| t.writes_disjoint || t.extent == Some(1))
}

/// The THREAD tasks of kernel `k`.
fn tasks(k: &Kernel) -> usize {
    let prepared = uopc_ir::prepare(&k.program, &uopc_ir::PrepareOptions::default()).expect("prepares");
    prepared.thread.and_then(|t| t.extent).unwrap_or(1)
}

// Sizes: 96 rows, k = 80, 144 columns; each output is an 80-term f32 dot product of values in
// [-1, 1), rounding error ~ 80 * 2^-24 * |terms|, far below the 1e-5 (relative to 1 + |want|)
// asserted.
const N: usize = 96;
const K: usize = 80;
const M: usize = 144;

#[test]
fn bias_and_gelu_fuse_into_the_gemm() {
    let (x, w, b) =
        (uniform(&[N, K], -1.0, 1.0, 1), uniform(&[K, M], -1.0, 1.0, 2), uniform(&[M], -1.0, 1.0, 3));
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let y = (tx.matmul(&tw) + &tb).gelu_tanh();
    let plan = plan_of(&y);
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert_eq!(gemms(&plan), [(format!("r_{N}_{M}"), true)], "{plan}");
    assert!(plan.to_string().contains("[tile gemm + epilogue]"), "{plan}");
    // No temporary: the GEMM writes the output block, the epilogue rewrites it.
    assert!(plan.temps.is_empty(), "{plan}");
    // The GELU runs as one activation tile op per row; the loop only adds the bias.
    assert_eq!(activations(&plan.kernels[0]), [uopc_tile::Activation::GeluTanh], "{plan}");
    let got = y.to_ndarray::<f32>().unwrap();
    let mut want = matmul64(&f64s(&x), &f64s(&w));
    for ((i, j), v) in want.clone().into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        want[[i, j]] = gelu64(v + f64::from(b[[j]]));
    }
    assert_close(&got, &want, 1e-5);
}

#[test]
fn bias_and_exact_gelu_fuse_into_the_gemm() {
    let (x, w, b) =
        (uniform(&[N, K], -2.0, 2.0, 11), uniform(&[K, M], -1.0, 1.0, 12), uniform(&[M], -1.0, 1.0, 13));
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let y = (tx.matmul(&tw) + &tb).gelu();
    let plan = plan_of(&y);
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert_eq!(activations(&plan.kernels[0]), [uopc_tile::Activation::Gelu], "{plan}");
    let got = y.to_ndarray::<f32>().unwrap();
    let mut want = matmul64(&f64s(&x), &f64s(&w));
    for ((i, j), v) in want.clone().into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        let z = v + f64::from(b[[j]]);
        want[[i, j]] = 0.5 * z * (1.0 + libm::erf(z / std::f64::consts::SQRT_2));
    }
    assert_close(&got, &want, 1e-5);
}

/// The activation tile ops of kernel `k`, and whether its loops still take an exponential.
fn activations(k: &Kernel) -> Vec<uopc_tile::Activation> {
    let nodes = uopc_ir::UOp::toposort(std::slice::from_ref(&k.program));
    let exp2 = nodes.iter().any(|u| matches!(u.op(), Op::Unary(uopc_ir::UnaryOp::Exp2)));
    let kinds: Vec<_> = nodes
        .iter()
        .filter_map(|u| match u.op() {
            Op::Tile(uopc_ir::TileOp::Activation { kind, .. }) => Some(*kind),
            _ => None,
        })
        .collect();
    assert!(kinds.is_empty() || !exp2, "an activation tile op and an exponential in the loop");
    kinds
}

#[test]
fn silu_fuses_as_a_tile_op_and_a_body_that_is_not_exactly_an_activation_keeps_its_loop() {
    let (x, w, b) =
        (uniform(&[N, K], -4.0, 4.0, 21), uniform(&[K, M], -1.0, 1.0, 22), uniform(&[M], -1.0, 1.0, 23));
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let pre = tx.matmul(&tw) + &tb;
    let silu = pre.silu();
    let plan = plan_of(&silu);
    assert_eq!(activations(&plan.kernels[0]), [uopc_tile::Activation::Silu], "{plan}");
    let dot = matmul64(&f64s(&x), &f64s(&w));
    let mut want = dot.clone();
    for ((i, j), v) in dot.clone().into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        let z = v + f64::from(b[[j]]);
        want[[i, j]] = z / (1.0 + (-z).exp());
    }
    assert_close(&silu.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    // A scaled GELU and a sigmoid alone are other functions: the loop computes them.
    let scaled = pre.gelu_tanh() * 2.0;
    let plan = plan_of(&scaled);
    assert!(plan.kernels[0].has_epilogue() && activations(&plan.kernels[0]).is_empty(), "{plan}");
    let mut want = dot.clone();
    for ((i, j), v) in dot.into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        want[[i, j]] = 2.0 * gelu64(v + f64::from(b[[j]]));
    }
    assert_close(&scaled.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    assert!(activations(&plan_of(&pre.sigmoid()).kernels[0]).is_empty());
}

#[test]
fn residual_and_scale_fuse_and_an_unfused_plan_has_one_kernel_more() {
    let (x, w, r) =
        (uniform(&[N, K], -1.0, 1.0, 4), uniform(&[K, M], -1.0, 1.0, 5), uniform(&[N, M], -1.0, 1.0, 6));
    let (tx, tw, tr) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&r));
    let y = tx.matmul(&tw) * 0.5 + &tr;
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [(format!("r_{N}_{M}"), true)], "{plan}");
    assert_eq!(plan.kernels.len(), 1);
    // The experiment switch brings back the separate elementwise kernel.
    let unfused = RealizeOptions::default()
        .with_experiments(Experiments { unfused_gemm_epilogues: true, ..Experiments::default() });
    let split = make_plan(&[y.uop().clone()], &unfused).unwrap();
    assert_eq!(split.kernel_names(), [format!("r_{N}_{M}"), format!("e_{N}_{M}")], "{split}");
    assert!(split.kernels[0].uses_tile_ops() && !split.kernels[0].has_epilogue());
    let want = matmul64(&f64s(&x), &f64s(&w)) * 0.5 + f64s(&r);
    assert_close(&y.to_ndarray_with::<f32>(&unfused).unwrap(), &want, 1e-5);
    // The same product with loops instead of tile GEMMs: the reduce is its own kernel.
    let loops =
        make_plan(&[y.uop().clone()], &RealizeOptions::default().with_opt(DefaultOpt::loops())).unwrap();
    assert_eq!(loops.kernels.len(), 2, "{loops}");
    assert_close(&y.to_ndarray::<f32>().unwrap(), &want, 1e-5);
}

#[test]
fn batched_gemm_with_a_bias_fuses() {
    let (x, w, b) = (
        uniform(&[3, 40, K], -1.0, 1.0, 7),
        uniform(&[3, K, 48], -1.0, 1.0, 8),
        uniform(&[48], -1.0, 1.0, 9),
    );
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let y = (tx.matmul(&tw) + &tb).relu();
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [("r_3_40_48".to_string(), true)], "{plan}");
    let got = y.to_ndarray::<f32>().unwrap();
    let mut want = ArrayD::<f64>::zeros(IxDyn(&[3, 40, 48]));
    for item in 0..3 {
        for i in 0..40 {
            for j in 0..48 {
                let dot: f64 = (0..K).map(|p| f64::from(x[[item, i, p]]) * f64::from(w[[item, p, j]])).sum();
                want[[item, i, j]] = (dot + f64::from(b[[j]])).max(0.0);
            }
        }
    }
    assert_close(&got, &want, 1e-5);
}

#[test]
fn a_residual_read_through_a_reshape_of_the_rows_fuses() {
    // A transformer's projection: (batch * tokens, d) rows, viewed as (batch, tokens, d), plus
    // a bias and the residual stream of that shape.
    let (x, w, b, r) = (
        uniform(&[N, K], -1.0, 1.0, 22),
        uniform(&[K, M], -1.0, 1.0, 23),
        uniform(&[M], -1.0, 1.0, 24),
        uniform(&[4, N / 4, M], -1.0, 1.0, 25),
    );
    let (tx, tw, tb, tr) =
        (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b), Tensor::from_array(&r));
    let y = &tr + &(tx.matmul(&tw) + &tb).reshape(&[4, N / 4, M]);
    let plan = plan_of(&y);
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert_eq!(gemms(&plan), [(format!("r_4_{}_{M}", N / 4), true)], "{plan}");
    let h = matmul64(&f64s(&x), &f64s(&w));
    let mut want = f64s(&r);
    for ((item, t, j), v) in want.clone().into_dimensionality::<ndarray::Ix3>().unwrap().indexed_iter() {
        want[[item, t, j]] = v + h[[item * (N / 4) + t, j]] + f64::from(b[[j]]);
    }
    assert_close(&y.to_ndarray::<f32>().unwrap(), &want, 1e-5);
}

#[test]
fn blocks_of_few_rows_split_over_columns_run_in_parallel() {
    // 16 rows are one row block: the tasks are column blocks, each GEMM block and its
    // epilogue a 16 x (a divisor of 1024) block of rows 1024 apart, which the backend must
    // still prove disjoint to run them at once.
    let (x, w, b) = (
        uniform(&[16, 64], -1.0, 1.0, 26),
        uniform(&[64, 1024], -1.0, 1.0, 27),
        uniform(&[1024], -1.0, 1.0, 28),
    );
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let y = (tx.matmul(&tw) + &tb).relu();
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [("r_16_1024".to_string(), true)], "{plan}");
    assert!(tasks(&plan.kernels[0]) > 1, "{}", plan.kernels[0].program.short());
    assert!(runs_in_parallel(&plan.kernels[0]));
    let h = matmul64(&f64s(&x), &f64s(&w));
    let mut want = h.clone();
    for ((i, j), v) in h.into_dimensionality::<ndarray::Ix2>().unwrap().indexed_iter() {
        want[[i, j]] = (v + f64::from(b[[j]])).max(0.0);
    }
    assert_close(&y.to_ndarray::<f32>().unwrap(), &want, 1e-5);
}

#[test]
fn bf16_matmul_rounds_in_the_gemm_kernel() {
    // 200 x 96 @ 96 x 272: the per-task f32 scratch block limits the columns per task.
    let (n, k, m) = (200, 96, 272);
    let to_bf16 = |a: ArrayD<f32>| a.mapv(bf16::from_f32);
    let (x, w) = (to_bf16(uniform(&[n, k], -1.0, 1.0, 10)), to_bf16(uniform(&[k, m], -1.0, 1.0, 11)));
    let y = Tensor::from_array(&x).matmul(&Tensor::from_array(&w));
    assert_eq!(y.dtype(), DType::BF16);
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [(format!("r_{n}_{m}"), true)], "{plan}");
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert!(tasks(&plan.kernels[0]) > 1 && runs_in_parallel(&plan.kernels[0]), "{plan}");
    // Nothing but the rounding follows the product: on AMX, and on the paths that widen into
    // the f32 GEMM, the GEMM writes bf16 itself; else one conversion per block; never a loop.
    let nodes = uopc_ir::UOp::toposort(std::slice::from_ref(&plan.kernels[0].program));
    let converts = nodes.iter().any(|u| matches!(u.op(), Op::Tile(uopc_ir::TileOp::Convert { .. })));
    let loops = nodes.iter().any(|u| matches!(u.op(), Op::Range { axis: uopc_ir::AxisType::Loop, .. }));
    let rounds_itself = uopc_tile::Bf16Path::detect().rounds_in_cache();
    let lowering = if rounds_itself { "rounded_gemm" } else { "gemm_epilogue" };
    assert_eq!(plan.kernels[0].lowering, lowering, "{plan}");
    assert!(converts != rounds_itself && !loops, "{plan}");
    let wide = |a: &ArrayD<bf16>| a.mapv(|v| f64::from(v.to_f32()));
    let want = matmul64(&wide(&x), &wide(&w));
    // Products of bf16 values are exact in f32; the f32 sum is within k * 2^-24 * sum |terms|
    // and the one rounding to bf16 within 2^-8 relative: 2^-8 * (1 + |want|) bounds both.
    let check = |y: &Tensor, want: &ArrayD<f64>| {
        for (g, w) in y.to_ndarray::<bf16>().unwrap().iter().zip(want.iter()) {
            let g = f64::from(g.to_f32());
            assert!((g - w).abs() <= (1.0 + w.abs()) / 256.0, "{g} vs {w}");
        }
    };
    check(&y, &want);
    // A stored transposed and 4096 columns: the plain GEMM's blocks (one per core up to 16
    // cores) outgrow the scratch block, and narrower ones would each repack A once more, so
    // the cost model keeps the rounding a kernel of its own, unless the GEMM rounds itself
    // in the plain GEMM's blocks.
    let wide_cols = 4096;
    let w = to_bf16(uniform(&[k, wide_cols], -1.0, 1.0, 12));
    let want = matmul64(&wide(&x), &wide(&w));
    let xt = x.t().as_standard_layout().to_owned().into_dyn();
    let y = Tensor::from_array(&xt).t().matmul(&Tensor::from_array(&w));
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [(format!("r_{n}_{wide_cols}"), rounds_itself)], "{plan}");
    assert_eq!(plan.kernels.len(), if rounds_itself { 1 } else { 2 }, "{plan}");
    check(&y, &want);
}

#[test]
fn f16_matmul_rounds_in_one_gemm_call_on_every_isa() {
    // Deeper than one k slab, and A stored transposed too: each is one kernel whose GEMM
    // writes f16 itself, in the plain GEMM's blocks (one call cutting itself, or whole tasks).
    let (n, k, m) = (200, 600, 272);
    let to_f16 = |a: ArrayD<f32>| a.mapv(half::f16::from_f32);
    let (x, w) = (to_f16(uniform(&[n, k], -1.0, 1.0, 20)), to_f16(uniform(&[k, m], -1.0, 1.0, 21)));
    let wide = |a: &ArrayD<half::f16>| a.mapv(|v| f64::from(v.to_f32()));
    let want = matmul64(&wide(&x), &wide(&w));
    let xt = x.t().as_standard_layout().to_owned().into_dyn();
    for (form, y) in [
        ("ab", Tensor::from_array(&x).matmul(&Tensor::from_array(&w))),
        ("at_b", Tensor::from_array(&xt).t().matmul(&Tensor::from_array(&w))),
    ] {
        assert_eq!(y.dtype(), DType::F16);
        let plan = plan_of(&y);
        assert_eq!(gemms(&plan), [(format!("r_{n}_{m}"), true)], "{form}: {plan}");
        assert_eq!(plan.kernels.len(), 1, "{form}: {plan}");
        assert_eq!(plan.kernels[0].lowering, "rounded_gemm", "{form}: {plan}");
        // The one kernel writes the f16 output whole, so it is not zeroed before the run.
        assert_eq!(plan.unzeroed_outputs(), 1, "{form}: {plan}");
        // f16 products are exact in f32; the f32 sum is within k * 2^-24 * sum |terms| (at
        // most 600 * 2^-24 * 600 here) and the one rounding to f16 within 2^-11 relative.
        for (g, w) in y.to_ndarray::<half::f16>().unwrap().iter().zip(want.iter()) {
            let g = f64::from(g.to_f32());
            assert!((g - w).abs() <= w.abs() / 2048.0 + 0.03, "{form}: {g} vs {w}");
        }
    }
    // An f32 product rounded to f16 is not one the GEMM rounds itself: with A transposed and
    // 4096 columns, the scratch blocks an epilogue needs would repack A, so the rounding stays
    // a kernel of its own, as for bf16 off the paths that round in the GEMM.
    let (xf, wf) = (uniform(&[k, n], -1.0, 1.0, 22), uniform(&[k, 4096], -1.0, 1.0, 23));
    let y = Tensor::from_array(&xf).t().matmul(&Tensor::from_array(&wf)).cast(DType::F16);
    let plan = plan_of(&y);
    assert_eq!(gemms(&plan), [(format!("r_{n}_4096"), false)], "{plan}");
    assert_eq!(plan.kernels.len(), 2, "{plan}");
}

#[test]
fn consumers_that_need_other_elements_do_not_fuse_and_stay_right() {
    let (x, w, b) =
        (uniform(&[N, K], -1.0, 1.0, 12), uniform(&[K, M], -1.0, 1.0, 13), uniform(&[M], -1.0, 1.0, 14));
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let h = tx.matmul(&tw);
    let h64 = matmul64(&f64s(&x), &f64s(&w));
    // Used elementwise with a bias and also summed down its columns: two readers, so the
    // GEMM is its own kernel and neither consumer carries it.
    let y = (&h + &tb).relu() + h.sum(0, true);
    let plan = plan_of(&y);
    assert!(gemms(&plan).iter().all(|(_, epilogue)| !epilogue), "{plan}");
    let got = y.to_ndarray::<f32>().unwrap();
    for i in 0..N {
        for j in 0..M {
            let (sum, magnitude) =
                (0..N).fold((0.0, 0.0), |(s, a), r| (s + h64[[r, j]], a + h64[[r, j]].abs()));
            let want = (h64[[i, j]] + f64::from(b[[j]])).max(0.0) + sum;
            // The column sum in f32: within N * 2^-24 of the sum of magnitudes; each GEMM
            // output (80 terms in [-1, 1)) well within 1e-5 (1 + |want|).
            let tol = N as f64 * magnitude / f64::from(1u32 << 24) + 1e-5 * (1.0 + want.abs());
            assert!((f64::from(got[[i, j]]) - want).abs() <= tol, "({i}, {j}): {} vs {want}", got[[i, j]]);
        }
    }
    // One reader, but it also reads the square GEMM output transposed: other elements.
    let w2 = uniform(&[K, N], -1.0, 1.0, 21);
    let sq = tx.matmul(&Tensor::from_array(&w2));
    let y = &sq * 2.0 + &sq.t();
    let plan = plan_of(&y);
    assert!(gemms(&plan).iter().all(|(_, epilogue)| !epilogue), "{plan}");
    let s64 = matmul64(&f64s(&x), &f64s(&w2));
    let mut want = s64.clone();
    for i in 0..N {
        for j in 0..N {
            want[[i, j]] = 2.0 * s64[[i, j]] + s64[[j, i]];
        }
    }
    assert_close(&y.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    // A row softmax reads whole rows of the GEMM output: not an elementwise consumer.
    let s = tx.matmul(&tw).softmax(-1);
    let plan = plan_of(&s);
    assert!(gemms(&plan).iter().all(|(_, epilogue)| !epilogue), "{plan}");
    let got = s.to_ndarray::<f32>().unwrap();
    let mut want = h64.clone();
    for i in 0..N {
        let top = (0..M).map(|j| h64[[i, j]]).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = (0..M).map(|j| (h64[[i, j]] - top).exp()).sum();
        for j in 0..M {
            want[[i, j]] = (h64[[i, j]] - top).exp() / z;
        }
    }
    assert_close(&got, &want, 1e-5);
    // The GEMM output itself is a result: nothing to fuse into.
    let plan = make_plan(&[h.uop().clone(), (&h + &tb).uop().clone()], &RealizeOptions::default()).unwrap();
    assert!(plan.kernels.iter().all(|k| !k.has_epilogue()), "{plan}");
}

#[test]
fn gradients_through_a_fused_layer_match_finite_differences() {
    // f64 tensors: the tile GEMM is f32-only, so this checks the autograd graph through the
    // same ops; the f32 case below checks the fused plan's gradient against f64.
    let err = grad_err(
        &[rand64(&[6, 5], -1.0, 1.0, 15), rand64(&[5, 7], -1.0, 1.0, 16), rand64(&[7], -1.0, 1.0, 17)],
        &|t| (t[0].matmul(&t[1]) + &t[2]).gelu_tanh(),
    );
    assert!(err < TOL, "{err:e}");
    let (x, w, b) =
        (uniform(&[N, K], -1.0, 1.0, 18), uniform(&[K, M], -1.0, 1.0, 19), uniform(&[M], -1.0, 1.0, 20));
    let (tx, tw, tb) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&b));
    let loss = (tx.matmul(&tw) + &tb).gelu_tanh().sum(-1, false).sum(-1, false);
    let grads = gradient(&loss, &[&tb]).unwrap();
    let got = grads[0].to_ndarray::<f32>().unwrap();
    // d loss / d b_j = sum_i gelu'(h_ij + b_j), by central differences of the f64 GELU.
    let h = matmul64(&f64s(&x), &f64s(&w));
    let want: Vec<f64> = (0..M)
        .map(|j| {
            (0..N)
                .map(|i| {
                    let v = h[[i, j]] + f64::from(b[[j]]);
                    (gelu64(v + 1e-6) - gelu64(v - 1e-6)) / 2e-6
                })
                .sum()
        })
        .collect();
    assert_close(&got, &ArrayD::from_shape_vec(IxDyn(&[M]), want).unwrap(), 1e-4);
}
