//! Attention on lazy tensors: the kernel node against the f64 reference, its place in plans,
//! its gradient against an independent graph, and arguments that do not fit.

use uopc_ir::DType;
use uopc_kernels::sdpa::{Extras, MaskKind, SdpaConfig, reference_f64, scaled_dot_product_attention};
use uopc_tensor::{RealizeOptions, Tensor, gradient, make_plan};

/// `n` values in [-1, 1] from a xorshift generator seeded by `seed`.
pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 20001) as f32 / 10000.0 - 1.0
        })
        .collect()
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max)
}

#[test]
fn batched_gqa_with_masks_matches_the_reference() {
    let (b, h, hkv, n_q, n_k, d) = (2, 4, 2, 9, 13, 8);
    let (qv, kv, vv) =
        (values(b * h * n_q * d, 1), values(b * hkv * n_k * d, 2), values(b * hkv * n_k * d, 3));
    let q = Tensor::from_vec(qv.clone(), &[b, h, n_q, d]);
    let k = Tensor::from_vec(kv.clone(), &[b, hkv, n_k, d]);
    let v = Tensor::from_vec(vv.clone(), &[b, hkv, n_k, d]);
    // A bool mask over (B, 1, 1, n_k): padding; and a bias over (H, n_q, n_k).
    let keep: Vec<bool> = (0..b * n_k).map(|i| i % n_k < [13, 6][i / n_k]).collect();
    let bias: Vec<f32> =
        values(h * n_q * n_k, 4).iter().map(|x| if *x > 0.8 { f32::NEG_INFINITY } else { *x }).collect();
    for causal in [false, true] {
        let ones: Vec<f32> = keep.iter().map(|&x| f32::from(u8::from(x))).collect();
        let mask = Tensor::from_vec(ones, &[b, 1, 1, n_k]).try_ne(&Tensor::full(&[], 0.0)).unwrap();
        assert_eq!(mask.dtype(), DType::Bool);
        let out = scaled_dot_product_attention(&q, &k, &v, Some(&mask), causal, Some(0.3)).unwrap();
        let config = SdpaConfig {
            kv_heads: hkv,
            causal,
            scale: Some(0.3),
            mask: MaskKind::Bool([b, 1, 1, n_k]),
            ..SdpaConfig::new(b, h, n_q, n_k, d)
        };
        let want = reference_f64(&config, &qv, &kv, &vv, Extras { mask: Some(&keep), ..Extras::default() });
        let got = out.to_ndarray::<f32>().unwrap();
        assert!(max_err(got.as_slice().unwrap(), &want) < 2e-5);

        let bias_t = Tensor::from_vec(bias.clone(), &[h, n_q, n_k]);
        let out = scaled_dot_product_attention(&q, &k, &v, Some(&bias_t), causal, None).unwrap();
        let config = SdpaConfig { mask: MaskKind::Bias([1, h, n_q, n_k]), scale: None, ..config };
        let want = reference_f64(&config, &qv, &kv, &vv, Extras { bias: Some(&bias), ..Extras::default() });
        let got = out.to_ndarray::<f32>().unwrap();
        assert!(max_err(got.as_slice().unwrap(), &want) < 2e-5);
    }
}

#[test]
fn any_rank_from_one_head_to_several_batch_axes() {
    // (n, D): one head; (2, 3, H, n, D): two batch axes, flattened.
    for shape in [vec![17, 16], vec![2, 3, 2, 5, 4]] {
        let n: usize = shape.iter().product();
        let (qv, kv, vv) = (values(n, 5), values(n, 6), values(n, 7));
        let t = |x: &[f32]| Tensor::from_vec(x.to_vec(), &shape);
        let out = scaled_dot_product_attention(&t(&qv), &t(&kv), &t(&vv), None, true, None).unwrap();
        let r = shape.len();
        let (rows, d) = (shape[r - 2], shape[r - 1]);
        let heads = n / (rows * d);
        let config = SdpaConfig { causal: true, ..SdpaConfig::new(1, heads, rows, rows, d) };
        let want = reference_f64(&config, &qv, &kv, &vv, Extras::default());
        let got = out.to_ndarray::<f32>().unwrap();
        assert_eq!(got.shape(), &shape[..]);
        assert!(max_err(got.as_slice().unwrap(), &want) < 2e-5);
    }
}

#[test]
fn the_kernel_node_is_one_kernel_of_the_plan() {
    let x = Tensor::from_vec(values(2 * 3 * 8 * 4, 8), &[2, 3, 8, 4]);
    let k = Tensor::from_vec(values(2 * 3 * 8 * 4, 9), &[2, 3, 8, 4]);
    // q computed by another kernel, the output consumed by a third.
    let q = &x * 2.0;
    let out = scaled_dot_product_attention(&q, &k, &k, None, false, None).unwrap();
    let loss = out.sum(-1, false);
    let plan = make_plan(&[loss.uop().clone()], &RealizeOptions::default()).unwrap();
    let names = plan.kernel_names();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[1], "sdpa_flash_tile_ops");
    assert!(plan.kernels[1].uses_tile_ops());
    // No temporary holds scores: the largest is the output with the rows' lse beside it.
    let (q_len, rows) = (2 * 3 * 8 * 4, 2 * 3 * 8);
    assert!(plan.temp_sizes().iter().all(|&s| s <= q_len + rows), "{:?}", plan.temp_sizes());
}

#[test]
fn its_gradient_matches_the_unfused_graph() {
    let (b, h, n, d) = (1, 2, 6, 4);
    let mk = |seed| Tensor::from_vec(values(b * h * n * d, seed), &[b, h, n, d]);
    let (q, k, v, w) = (mk(10), mk(11), mk(12), mk(13));
    let fused = scaled_dot_product_attention(&q, &k, &v, None, false, None).unwrap();
    let plain = uopc_tensor::masked::attention_masked(&q, &k, &v, None, false);
    let g1 =
        gradient(&(&fused * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false), &[&q, &k, &v])
            .unwrap();
    let g2 =
        gradient(&(&plain * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false), &[&q, &k, &v])
            .unwrap();
    for (a, b) in g1.iter().zip(&g2) {
        let (a, b) = (a.to_ndarray::<f32>().unwrap(), b.to_ndarray::<f32>().unwrap());
        let diff = (&a - &b).mapv(f32::abs).iter().copied().fold(0.0, f32::max);
        assert!(diff < 1e-5, "{diff}");
        assert!(a.iter().any(|&x| x.abs() > 1e-3), "the gradient is not trivially zero");
    }
}

#[test]
fn arguments_that_do_not_fit_are_errors_naming_them() {
    let t = |shape: &[usize]| Tensor::from_vec(vec![0.5f32; shape.iter().product()], shape);
    let (q, k) = (t(&[1, 4, 8, 16]), t(&[1, 3, 8, 16]));
    let msg = |r: Result<Tensor, uopc_kernels::sdpa::SdpaError>| r.unwrap_err().to_string();
    assert!(msg(scaled_dot_product_attention(&q, &k, &k, None, false, None)).contains("kv_heads"));
    let k = t(&[1, 2, 8, 16]);
    assert!(msg(scaled_dot_product_attention(&q, &k, &t(&[1, 2, 8, 8]), None, false, None)).contains("`v`"));
    assert!(
        msg(scaled_dot_product_attention(&q, &t(&[2, 2, 8, 16]), &t(&[2, 2, 8, 16]), None, false, None))
            .contains("`k`")
    );
    let bad_mask = t(&[1, 3, 8, 8]);
    assert!(msg(scaled_dot_product_attention(&q, &k, &k, Some(&bad_mask), false, None)).contains("`mask`"));
    let wide = t(&[8]).cast(DType::F64);
    assert!(msg(scaled_dot_product_attention(&q, &k, &k, Some(&wide), false, None)).contains("`mask`"));
    assert!(
        msg(scaled_dot_product_attention(&q.cast(DType::F64), &k, &k, None, false, None)).contains("`q`")
    );
}

#[test]
fn the_gradient_runs_the_tile_backward_and_matches_f64() {
    use uopc_kernels::sdpa::reference_backward_f64;
    let (b, h, hkv, n_q, n_k, d) = (2, 4, 2, 11, 19, 8);
    let (qv, kv, vv) =
        (values(b * h * n_q * d, 21), values(b * hkv * n_k * d, 22), values(b * hkv * n_k * d, 23));
    let dov = values(b * h * n_q * d, 24);
    let bias: Vec<f32> =
        values(b * n_k, 25).iter().map(|x| if *x > 0.7 { f32::NEG_INFINITY } else { *x }).collect();
    for causal in [false, true] {
        for with_bias in [false, true] {
            let q = Tensor::from_vec(qv.clone(), &[b, h, n_q, d]);
            let k = Tensor::from_vec(kv.clone(), &[b, hkv, n_k, d]);
            let v = Tensor::from_vec(vv.clone(), &[b, hkv, n_k, d]);
            let bias_t = Tensor::from_vec(bias.clone(), &[b, 1, 1, n_k]);
            let mask = with_bias.then_some(&bias_t);
            let out = scaled_dot_product_attention(&q, &k, &v, mask, causal, None).unwrap();
            let w = Tensor::from_vec(dov.clone(), &[b, h, n_q, d]);
            let loss = (&out * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false);
            let grads = gradient(&loss, &[&q, &k, &v]).unwrap();
            // The plan of the gradient holds the tile backward, not an n_q x n_k buffer.
            let roots: Vec<_> = grads.iter().map(|g| g.uop().clone()).collect();
            let plan = make_plan(&roots, &RealizeOptions::default()).unwrap();
            assert!(plan.kernel_names().contains(&"sdpa_backward_tile_ops"), "{:?}", plan.kernel_names());
            // It reads the forward's output and lse: one attention forward in all.
            let forwards = plan.kernel_names().iter().filter(|n| n.starts_with("sdpa_f")).count();
            assert_eq!(forwards, 1, "{:?}", plan.kernel_names());
            // The largest temporary is the packed dq, dk, dv; none holds the scores.
            let (q_len, kv_len) = (b * h * n_q * d, b * hkv * n_k * d);
            assert!(
                plan.temp_sizes().iter().all(|&s| s <= q_len + 2 * kv_len && s != b * h * n_q * n_k),
                "{:?}",
                plan.temp_sizes()
            );
            let config = SdpaConfig {
                kv_heads: hkv,
                causal,
                mask: if with_bias { MaskKind::Bias([b, 1, 1, n_k]) } else { MaskKind::None },
                ..SdpaConfig::new(b, h, n_q, n_k, d)
            };
            let extras = Extras { bias: with_bias.then_some(&bias[..]), ..Extras::default() };
            let want = reference_backward_f64(&config, &qv, &kv, &vv, &dov, extras);
            for (g, w) in grads.iter().zip(&want) {
                let got = g.to_ndarray::<f32>().unwrap();
                // Sums of at most n_k products of values below 1 in f32: well under 1e-4.
                let e = max_err(got.as_slice().unwrap(), w);
                assert!(e < 1e-4, "causal {causal}, bias {with_bias}: {e}");
                // Run again on the plan's pooled (now dirty) buffers: the same values.
                assert_eq!(g.to_ndarray::<f32>().unwrap(), got);
            }
        }
    }
}

/// The bias's gradient through the Tensor API: against the f64 reference for biases broadcast
/// in several ways, against central finite differences of the f64 forward, and only in the
/// plan when the bias's gradient is asked for.
#[test]
fn the_bias_gradient_runs_its_own_kernel_only_when_asked_for() {
    use uopc_kernels::sdpa::reference_backward_f64;
    let (b, h, hkv, n_q, n_k, d) = (2, 4, 2, 7, 11, 8);
    let (qv, kv, vv) =
        (values(b * h * n_q * d, 31), values(b * hkv * n_k * d, 32), values(b * hkv * n_k * d, 33));
    let dov = values(b * h * n_q * d, 34);
    // (tensor shape, its (B, H, n_q, n_k) form)
    for (causal, shape, kind) in [
        (false, vec![b, h, n_q, n_k], [b, h, n_q, n_k]),
        (true, vec![h, n_q, n_k], [1, h, n_q, n_k]),
        (false, vec![b, 1, 1, n_k], [b, 1, 1, n_k]),
        (true, vec![n_q, n_k], [1, 1, n_q, n_k]),
    ] {
        let len: usize = shape.iter().product();
        let bias: Vec<f32> =
            values(len, 35).iter().map(|x| if *x > 0.85 { f32::NEG_INFINITY } else { 2.0 * x }).collect();
        let q = Tensor::from_vec(qv.clone(), &[b, h, n_q, d]);
        let k = Tensor::from_vec(kv.clone(), &[b, hkv, n_k, d]);
        let v = Tensor::from_vec(vv.clone(), &[b, hkv, n_k, d]);
        let bias_t = Tensor::from_vec(bias.clone(), &shape);
        let out = scaled_dot_product_attention(&q, &k, &v, Some(&bias_t), causal, None).unwrap();
        let w = Tensor::from_vec(dov.clone(), &[b, h, n_q, d]);
        let loss = (&out * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false);

        let without = gradient(&loss, &[&q, &k, &v]).unwrap();
        let roots: Vec<_> = without.iter().map(|g| g.uop().clone()).collect();
        let plan = make_plan(&roots, &RealizeOptions::default()).unwrap();
        let names = plan.kernel_names();
        assert!(!names.contains(&"sdpa_backward_bias_grad_tile_ops"), "{names:?}");

        let grads = gradient(&loss, &[&q, &k, &v, &bias_t]).unwrap();
        let roots: Vec<_> = grads.iter().map(|g| g.uop().clone()).collect();
        let plan = make_plan(&roots, &RealizeOptions::default()).unwrap();
        assert!(
            plan.kernel_names().contains(&"sdpa_backward_bias_grad_tile_ops"),
            "{:?}",
            plan.kernel_names()
        );
        assert_eq!(grads[3].shape(), &shape[..]);
        let config = SdpaConfig {
            kv_heads: hkv,
            causal,
            mask: MaskKind::Bias(kind),
            ..SdpaConfig::new(b, h, n_q, n_k, d)
        };
        let extras = Extras { bias: Some(&bias), ..Extras::default() };
        let want = reference_backward_f64(&config, &qv, &kv, &vv, &dov, extras);
        for (g, w) in grads.iter().zip(&want) {
            let got = g.to_ndarray::<f32>().unwrap();
            // At most b * h * n_q = 56 summed dS terms of O(1) values per dbias element.
            let e = max_err(got.as_slice().unwrap(), w);
            assert!(e < 1e-4, "{shape:?} causal {causal}: {e}");
        }
        assert!(want[3].iter().any(|x| x.abs() > 1e-3), "the bias gradient is not trivially zero");

        // Central differences of the f64 loss at a few elements (h = 2^-7; O(h^2) error).
        let dbias = grads[3].to_ndarray::<f32>().unwrap();
        let dbias = dbias.as_slice().unwrap();
        for idx in [0, len / 3, len / 2, len - 1] {
            if bias[idx] == f32::NEG_INFINITY {
                assert_eq!(dbias[idx], 0.0);
                continue;
            }
            let at = |delta: f32| {
                let mut bb = bias.clone();
                bb[idx] += delta;
                let o =
                    reference_f64(&config, &qv, &kv, &vv, Extras { bias: Some(&bb), ..Extras::default() });
                o.iter().zip(&dov).map(|(&x, &g)| x * f64::from(g)).sum::<f64>()
            };
            let step = 1.0f32 / 128.0;
            let fd = (at(step) - at(-step)) / (2.0 * f64::from(step));
            assert!(
                (fd - f64::from(dbias[idx])).abs() < 1e-3,
                "bias[{idx}]: fd {fd}, gradient {}",
                dbias[idx]
            );
        }
    }
}

/// One head of rank 2 (a single backward task, whose THREAD index folds to a constant): the
/// kernels still zero and write every element of their outputs.
#[test]
fn one_head_gradients_with_a_bias() {
    use uopc_kernels::sdpa::reference_backward_f64;
    let (n, d) = (10, 4);
    let (qv, kv, vv, dov) = (values(n * d, 41), values(n * d, 42), values(n * d, 43), values(n * d, 44));
    let bias = values(n * n, 45);
    let t = |x: &[f32], shape: &[usize]| Tensor::from_vec(x.to_vec(), shape);
    let (q, k, v, b) = (t(&qv, &[n, d]), t(&kv, &[n, d]), t(&vv, &[n, d]), t(&bias, &[n, n]));
    let out = scaled_dot_product_attention(&q, &k, &v, Some(&b), true, None).unwrap();
    let loss = (&out * &t(&dov, &[n, d])).sum(-1, false).sum(-1, false);
    let grads = gradient(&loss, &[&q, &k, &v, &b]).unwrap();
    let config =
        SdpaConfig { causal: true, mask: MaskKind::Bias([1, 1, n, n]), ..SdpaConfig::new(1, 1, n, n, d) };
    let want = reference_backward_f64(
        &config,
        &qv,
        &kv,
        &vv,
        &dov,
        Extras { bias: Some(&bias), ..Extras::default() },
    );
    for (g, w) in grads.iter().zip(&want) {
        let got = g.to_ndarray::<f32>().unwrap();
        // Sums of at most n = 10 products of values below 1 in f32.
        assert!(max_err(got.as_slice().unwrap(), w) < 1e-5);
    }
}

#[test]
fn huge_query_entries_give_the_reference_rows() {
    // Scores near 1e12 and beyond: every row's softmax is (almost) one-hot on its largest
    // score, and the running max must absorb the spread without inf - inf.
    let (b, h, n_q, n_k, d) = (1, 2, 5, 70, 16);
    for magnitude in [1e6f32, 1e12, 1e15, 1e18] {
        let qv: Vec<f32> = values(b * h * n_q * d, 5).iter().map(|x| x * magnitude).collect();
        let (kv, vv) = (values(b * h * n_k * d, 6), values(b * h * n_k * d, 7));
        let q = Tensor::from_vec(qv.clone(), &[b, h, n_q, d]);
        let k = Tensor::from_vec(kv.clone(), &[b, h, n_k, d]);
        let v = Tensor::from_vec(vv.clone(), &[b, h, n_k, d]);
        let out = scaled_dot_product_attention(&q, &k, &v, None, false, None).unwrap();
        let want = reference_f64(&SdpaConfig::new(b, h, n_q, n_k, d), &qv, &kv, &vv, Extras::default());
        let got = out.to_ndarray::<f32>().unwrap();
        let err = max_err(got.as_slice().unwrap(), &want);
        assert!(err < 1e-4, "magnitude {magnitude}: max error {err}");
    }
}

#[test]
fn huge_scores_through_the_derived_online_softmax_give_the_reference_rows() {
    // The same attention written as tensor operations, which the compiler turns into an online
    // softmax of its own.
    let (n_q, n_k, d) = (7, 300, 16);
    for magnitude in [1e12f32, 1e18] {
        let qv: Vec<f32> = values(n_q * d, 8).iter().map(|x| x * magnitude).collect();
        let (kv, vv) = (values(n_k * d, 9), values(n_k * d, 10));
        let q = Tensor::from_vec(qv.clone(), &[n_q, d]);
        let k = Tensor::from_vec(kv.clone(), &[n_k, d]);
        let v = Tensor::from_vec(vv.clone(), &[n_k, d]);
        let scale = Tensor::full(&[], 0.25);
        let out = (q.matmul(&k.t()) * &scale).softmax(1).matmul(&v);
        let want = reference_f64(&SdpaConfig::new(1, 1, n_q, n_k, d), &qv, &kv, &vv, Extras::default());
        let got = out.to_ndarray::<f32>().unwrap();
        let err = max_err(got.as_slice().unwrap(), &want);
        assert!(err < 1e-4, "magnitude {magnitude}: max error {err}");
    }
}

#[test]
fn the_named_options_form_is_the_function_and_its_errors_are_tensor_errors() {
    use uopc_kernels::sdpa::AttentionOp;
    use uopc_tensor::TensorError;
    let t = |shape: &[usize], seed: u64| Tensor::from_vec(values(shape.iter().product(), seed), shape);
    let (q, k, v) = (t(&[2, 4, 9, 8], 1), t(&[2, 2, 13, 8], 2), t(&[2, 2, 13, 8], 3));
    let bias = t(&[1, 1, 9, 13], 4);
    let named = q.sdpa(&k, &v).mask(&bias).causal().scale(0.3).run().unwrap();
    let positional = scaled_dot_product_attention(&q, &k, &v, Some(&bias), true, Some(0.3)).unwrap();
    assert_eq!(named.to_ndarray::<f32>().unwrap(), positional.to_ndarray::<f32>().unwrap());
    // Without options: unmasked, 1 / sqrt(D).
    let plain = q.sdpa(&k, &v).run().unwrap();
    let explicit = scaled_dot_product_attention(&q, &k, &v, None, false, Some(8f32.sqrt().recip())).unwrap();
    assert_eq!(plain.to_ndarray::<f32>().unwrap(), explicit.to_ndarray::<f32>().unwrap());
    match q.sdpa(&k, &t(&[2, 2, 12, 8], 5)).run() {
        Err(TensorError::Shape { op: "sdpa", msg }) => assert!(msg.starts_with("`v`"), "{msg}"),
        other => panic!("a v of another shape: {other:?}"),
    }
    match q.sdpa(&t(&[2, 3, 13, 8], 6), &t(&[2, 3, 13, 8], 7)).run() {
        Err(TensorError::Shape { op: "sdpa", msg }) => assert!(msg.contains("multiple"), "{msg}"),
        other => panic!("4 heads over 3 kv heads: {other:?}"),
    }
}
