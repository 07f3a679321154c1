//! N-D matmul with numpy broadcasting against an f64 loop reference, and its plan: batched
//! products of inputs are tile GEMMs.

use crate::common::*;
use ndarray::{ArrayD, IxDyn};
use uopc_tensor::*;

/// numpy's matmul in f64 loops, for operands of rank >= 2 (batch axes broadcast).
fn reference(a: &ArrayD<f32>, b: &ArrayD<f32>) -> ArrayD<f64> {
    let (sa, sb) = (a.shape(), b.shape());
    let (ra, rb) = (sa.len(), sb.len());
    let (n, k, m) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let rank = ra.max(rb) - 2;
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, rank + 2 - s.len()).chain(s[..s.len() - 2].iter().copied()).collect()
    };
    let (ba, bb) = (pad(sa), pad(sb));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let items: usize = batch.iter().product();
    let mut out = vec![0.0f64; items * n * m];
    let (a, b) = (a.as_standard_layout().to_owned(), b.as_standard_layout().to_owned());
    let (av, bv) = (a.as_slice().unwrap(), b.as_slice().unwrap());
    for item in 0..items {
        // Coordinates of the item, then each operand's own (broadcast axes at 0).
        let (mut rest, mut oa, mut ob, mut sta, mut stb) = (item, 0, 0, 1, 1);
        for ax in (0..rank).rev() {
            let c = rest % batch[ax];
            rest /= batch[ax];
            oa += if ba[ax] == 1 { 0 } else { c * sta };
            ob += if bb[ax] == 1 { 0 } else { c * stb };
            sta *= ba[ax];
            stb *= bb[ax];
        }
        for i in 0..n {
            for j in 0..m {
                out[(item * n + i) * m + j] = (0..k)
                    .map(|p| f64::from(av[(oa * n + i) * k + p]) * f64::from(bv[(ob * k + p) * m + j]))
                    .sum();
            }
        }
    }
    let shape: Vec<usize> = batch.iter().copied().chain([n, m]).collect();
    ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap()
}

#[test]
fn batched_shapes_broadcast_like_numpy() {
    let cases: [(&[usize], &[usize]); 6] = [
        (&[2, 4, 5, 3], &[2, 4, 3, 7]),
        (&[3, 5, 6], &[6, 4]),
        (&[5, 6], &[2, 3, 6, 4]),
        (&[2, 1, 5, 6], &[1, 3, 6, 2]),
        (&[1, 17, 33], &[4, 33, 20]),
        (&[7, 9], &[9, 11]),
    ];
    for (seed, (sa, sb)) in cases.iter().enumerate() {
        let (a, b) = (normal(sa, seed as u64), normal(sb, 100 + seed as u64));
        let got = Tensor::from_array(&a).matmul(&Tensor::from_array(&b)).to_ndarray::<f32>().unwrap();
        // Each output is a k-term f32 dot product of standard normals: ~1e-6 relative.
        assert_close(&got, &reference(&a, &b), 1e-4);
    }
}

#[test]
fn transposed_operands_and_vectors() {
    let a = normal(&[3, 8, 5], 1);
    let b = normal(&[3, 6, 8], 2);
    // a^T @ b^T over the batch: both operands strided views of inputs.
    let (ta, tb) = (Tensor::from_array(&a), Tensor::from_array(&b));
    let got = ta.transpose(1, 2).matmul(&tb.transpose(1, 2)).to_ndarray::<f32>().unwrap();
    let at = a.view().permuted_axes(vec![0, 2, 1]).to_owned().into_dyn();
    let bt = b.view().permuted_axes(vec![0, 2, 1]).to_owned().into_dyn();
    assert_close(&got, &reference(&at, &bt), 1e-4);
    // vector @ batch and batch @ vector drop the vector's axis.
    let v = normal(&[8], 3);
    let left = Tensor::from_array(&v).matmul(&Tensor::from_array(&b).transpose(1, 2));
    assert_eq!(left.shape(), &[3, 6]);
    let right = Tensor::from_array(&a).transpose(1, 2).matmul(&Tensor::from_array(&v));
    assert_eq!(right.shape(), &[3, 5]);
    let want = reference(&at, &v.clone().into_shape_with_order(IxDyn(&[8, 1])).unwrap());
    let got = right.to_ndarray::<f32>().unwrap();
    for (g, w) in got.iter().zip(want.iter()) {
        assert!((f64::from(*g) - w).abs() < 1e-4);
    }
    assert_eq!(Tensor::from_array(&a).try_matmul(&Tensor::full(&[5], 1.0)).unwrap().shape(), &[3, 8]);
    assert!(Tensor::from_array(&a).try_matmul(&Tensor::full(&[3, 7, 2], 1.0)).is_err());
    assert!(Tensor::full(&[2, 5, 8], 1.0).try_matmul(&Tensor::full(&[3, 8, 2], 1.0)).is_err());
}

#[test]
fn a_batched_product_of_inputs_is_one_tile_gemm_kernel() {
    let (a, b) = (normal(&[4, 12, 64, 32], 7), normal(&[4, 12, 32, 48], 8));
    let c = Tensor::from_array(&a).matmul(&Tensor::from_array(&b));
    let plan = make_plan(&[c.uop().clone()], &RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{:?}", plan.kernel_names());
    assert!(plan.kernels[0].uses_tile_ops(), "the batched product runs as tile GEMMs");
    assert_close(&c.to_ndarray::<f32>().unwrap(), &reference(&a, &b), 1e-4);
}

#[test]
fn a_few_row_product_is_split_over_columns_and_runs_in_parallel() {
    // 32 rows are one row block: the output columns are cut into blocks so every core gets
    // tasks, and the THREAD range must still be proven race-free to run in parallel.
    let (a, b) = (normal(&[32, 96], 9), normal(&[96, 1024], 10));
    for transposed_b in [false, true] {
        let tb = if transposed_b {
            let bt = b.view().reversed_axes().as_standard_layout().to_owned().into_dyn();
            Tensor::from_array(&bt).t()
        } else {
            Tensor::from_array(&b)
        };
        let c = Tensor::from_array(&a).matmul(&tb);
        let plan = make_plan(&[c.uop().clone()], &RealizeOptions::default()).unwrap();
        assert_eq!(plan.kernels.len(), 1, "{:?}", plan.kernel_names());
        let prepared =
            uopc_ir::prepare(&plan.kernels[0].program, &uopc_ir::PrepareOptions::default()).unwrap();
        let thread = prepared.thread.expect("a THREAD range");
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        if cores > 1 {
            assert!(thread.extent.unwrap() > 1, "columns split for {cores} cores");
        }
        assert!(thread.writes_disjoint, "column blocks proven disjoint");
        assert_close(&c.to_ndarray::<f32>().unwrap(), &reference(&a, &b), 1e-4);
    }
}

#[test]
fn a_weight_gradient_is_one_tile_gemm_writing_its_own_layout() {
    // dW = x^T dy is the transpose of the product autograd sums; pushed into the reduce, the
    // product writes W's (in, out) layout itself: no transposing copy after it.
    let (x, w, r) = (normal(&[64, 48], 11), normal(&[48, 80], 12), normal(&[64, 80], 13));
    let (tx, tw, tr) = (Tensor::from_array(&x), Tensor::from_array(&w), Tensor::from_array(&r));
    let loss = (&tx.matmul(&tw) * &tr).reshape(&[64 * 80]).sum(0, false);
    let dw = gradient(&loss, &[&tw]).unwrap().remove(0);
    let plan = make_plan(&[dw.uop().clone()], &RealizeOptions::default()).unwrap();
    // dy = r * d(sum)/dy is computed, so it is staged for the GEMM; the GEMM is the last kernel
    // and writes (48, 80) directly.
    assert_eq!(plan.kernel_names(), ["e_64_80", "r_48_80"]);
    assert!(plan.kernels[1].uses_tile_ops());
    let xt = x.view().reversed_axes().as_standard_layout().to_owned().into_dyn();
    assert_close(&dw.to_ndarray::<f32>().unwrap(), &reference(&xt, &r), 1e-4);
}

#[test]
fn a_product_whose_rows_have_no_even_divisor_splits_inside_its_gemm_call() {
    // 255 = 3 * 5 * 17 rows and 129 = 3 * 43 columns: exact blocks would leave a core idle on
    // two cores, so the one task's GEMM call cuts itself into ragged blocks over the pool.
    let (a, b) = (normal(&[255, 300], 11), normal(&[300, 129], 12));
    let c = Tensor::from_array(&a).matmul(&Tensor::from_array(&b));
    let plan = make_plan(&[c.uop().clone()], &RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{:?}", plan.kernel_names());
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let split = uopc_ir::UOp::toposort(std::slice::from_ref(&plan.kernels[0].program))
        .iter()
        .any(|u| matches!(u.op(), uopc_ir::Op::Tile(uopc_ir::TileOp::Gemm(s)) if s.parallel));
    if cores == 2 {
        assert!(split, "a split GEMM call on 2 cores");
        // The printed loop IR says so.
        let text = uopc_ir::print_program(&plan.kernels[0].program).unwrap();
        assert!(text.contains("tile_gemm 255x129x300 (split over the pool)"), "{text}");
    } else {
        println!("{cores} cores: the cut is the grid's own choice here (split: {split})");
    }
    // Fresh tensors, so each pool realizes the product itself.
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let got = pool
            .install(|| Tensor::from_array(&a).matmul(&Tensor::from_array(&b)).to_ndarray::<f32>().unwrap());
        assert_close(&got, &reference(&a, &b), 1e-4);
    }
}

#[test]
fn a_decode_projection_with_a_bias_cuts_k_inside_its_gemm_call() {
    // One row times a deep (in, out) weight plus a bias: the product is one task whose GEMM
    // call cuts k over the pool (each thread reads whole rows of the weight), and the bias is
    // added to the whole row after it.
    let (x, w, bias) = (normal(&[1, 1536], 21), normal(&[1536, 1536], 22), normal(&[1536], 23));
    let y =
        |x: &ArrayD<f32>| Tensor::from_array(x).matmul(&Tensor::from_array(&w)) + Tensor::from_array(&bias);
    let plan = make_plan(&[y(&x).uop().clone()], &RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernels.len(), 1, "{:?}", plan.kernel_names());
    let text = uopc_ir::print_program(&plan.kernels[0].program).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if cores >= 2 {
        assert!(text.contains("tile_gemm 1x1536x1536 (split over the pool)"), "{text}");
    } else {
        println!("SKIPPED: one core, so no split to check ({text})");
    }
    let mut want = reference(&x, &w);
    want.iter_mut().zip(bias.iter()).for_each(|(r, b)| *r += f64::from(*b));
    // Fresh tensors, so each pool realizes the product itself: one task, a k split of two
    // halves and of three thirds (on 1, 2 and 3 threads).
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let got = pool.install(|| y(&x).to_ndarray::<f32>().unwrap());
        assert_close(&got, &want, 1e-4);
    }
}

#[test]
fn a_staged_operand_leaves_a_transposed_weight_read_in_place() {
    // An RMS-normalized input large enough to be staged (not recomputed per output column)
    // times a (out, in) weight read through its transpose: the norm is one kernel, the
    // product one tile GEMM reading the weight where it is; no transposing copy of the weight.
    let (x, w) = (normal(&[3, 1536], 11), normal(&[576, 1536], 12));
    let xt = Tensor::from_array(&x);
    let normed = &xt * ((&xt * &xt).mean(-1, true) + 1e-5).sqrt().recip();
    let y = normed.matmul(&Tensor::from_array(&w).t());
    let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
    let names = plan.kernel_names();
    assert!(!names.iter().any(|n| n.contains("1536_576")), "no copy of the weight: {names:?}");
    assert!(plan.kernels.last().unwrap().uses_tile_ops(), "{names:?}");
    let rms = x.map_axis(ndarray::Axis(1), |r| {
        (r.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / 1536.0 + 1e-5).sqrt()
    });
    let mut want = ndarray::Array2::<f64>::zeros((3, 576));
    for i in 0..3 {
        for j in 0..576 {
            want[[i, j]] =
                (0..1536).map(|k| f64::from(x[[i, k]]) * f64::from(w[[j, k]])).sum::<f64>() / rms[i];
        }
    }
    assert_close(&y.to_ndarray::<f32>().unwrap(), &want.into_dyn(), 1e-4);
}

#[test]
fn a_staged_bf16_operand_is_read_in_place_by_the_16_bit_gemm() {
    use half::bf16;
    use uopc_ir::DType;
    // Activations rounded to bf16 into a buffer of their own, times a bf16 (out, in) weight:
    // one kernel rounds, one tile GEMM multiplies the two 16-bit buffers where they are (no
    // f32 copy of either), summing in f32.
    let (m, k, n) = (40, 96, 64);
    let (x, w) = (normal(&[m, k], 21), normal(&[n, k], 22));
    let wt = Tensor::from_array(&w).cast(DType::BF16).realize().unwrap();
    let scaled = &Tensor::from_array(&x) * 1.5;
    let y = scaled.cast(DType::BF16).staged().cast(DType::F32).matmul(&wt.cast(DType::F32).t());
    let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
    let names = plan.kernel_names();
    assert_eq!(plan.kernels.len(), 2, "the rounding, then the product: {names:?}");
    assert!(plan.kernels.last().unwrap().uses_tile_ops(), "{names:?}");
    let round = |v: f32| f64::from(bf16::from_f32(v).to_f32());
    let got = y.to_ndarray::<f32>().unwrap();
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|p| round(1.5 * x[[i, p]]) * round(w[[j, p]]));
            let (want, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            // Products of bf16 values are exact in f32; only the f32 sum rounds.
            let err = (f64::from(got[[i, j]]) - want).abs();
            assert!(err <= 1e-6 * size, "({i}, {j}): {} vs {want}", got[[i, j]]);
        }
    }
}
