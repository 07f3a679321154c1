//! The attention node reading q, k and v where they lie: heads split out of a fused QKV
//! projection's output by slicing, reshaping and permuting, as models write it. Values against
//! the f64 reference on copies made on the host, no copy kernels in the plan, gradients against
//! the node on materialized copies and against the unfused graph, and views that cannot be read
//! in place falling back to copies.

use super::sdpa_tensor::values;
use uopc_kernels::sdpa::{Extras, SdpaConfig, reference_f64, scaled_dot_product_attention};
use uopc_tensor::{ArgSource, RealizeOptions, Tensor, gradient, make_plan};

/// Heads `from .. from + heads` of each row of `qkv` (`(b * n, width)`), as `(b, heads, n, d)`.
fn heads_of(qkv: &Tensor, [b, n, d]: [usize; 3], from: usize, heads: usize) -> Tensor {
    qkv.try_slice(-1, from * d, (from + heads) * d)
        .and_then(|t| t.try_reshape(&[b, n, heads, d]))
        .and_then(|t| t.try_permute(&[0, 2, 1, 3]))
        .unwrap()
}

/// The same heads copied on the host into `(b, heads, n, d)` order.
fn host_heads(x: &[f32], width: usize, [b, n, d]: [usize; 3], from: usize, heads: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(b * heads * n * d);
    for item in 0..b {
        for h in 0..heads {
            for row in 0..n {
                let at = (item * n + row) * width + (from + h) * d;
                out.extend_from_slice(&x[at..at + d]);
            }
        }
    }
    out
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max)
}

#[test]
fn heads_of_a_fused_projection_are_read_in_place_and_match_the_reference() {
    // GQA 2:1, odd sizes.
    let (b, h, hkv, n, d) = (2, 4, 2, 13, 8);
    let width = (h + 2 * hkv) * d;
    let x = values(b * n * width, 1);
    let qkv = Tensor::from_vec(x.clone(), &[b * n, width]);
    let dims = [b, n, d];
    let (q, k, v) =
        (heads_of(&qkv, dims, 0, h), heads_of(&qkv, dims, h, hkv), heads_of(&qkv, dims, h + hkv, hkv));
    let (qv, kv, vv) = (
        host_heads(&x, width, dims, 0, h),
        host_heads(&x, width, dims, h, hkv),
        host_heads(&x, width, dims, h + hkv, hkv),
    );
    for causal in [false, true] {
        let out = scaled_dot_product_attention(&q, &k, &v, None, causal, None).unwrap();
        assert_eq!(out.shape(), [b, h, n, d]);
        let config = SdpaConfig { kv_heads: hkv, causal, ..SdpaConfig::new(b, h, n, n, d) };
        let want = reference_f64(&config, &qv, &kv, &vv, Extras::default());
        let got = out.to_ndarray::<f32>().unwrap();
        assert!(max_err(got.as_standard_layout().as_slice().unwrap(), &want) < 2e-5, "causal {causal}");
        // An output projection of the merged heads reads the node's output where it lies, and
        // the node reads the projection's output three times.
        let w = Tensor::from_vec(values(h * d * 5, 2), &[h * d, 5]);
        let merged = out.try_permute(&[0, 2, 1, 3]).unwrap().try_reshape(&[b * n, h * d]).unwrap();
        let plan = make_plan(&[merged.matmul(&w).uop().clone()], &RealizeOptions::default()).unwrap();
        assert_eq!(plan.kernel_names(), ["sdpa_flash_tile_ops", "r_26_5"], "{plan}");
        let attention = &plan.kernels[0];
        assert_eq!(attention.args[..3], [ArgSource::Input(0); 3], "{plan}");
        assert_eq!(plan.kernels[1].args[0], *attention.args.last().unwrap(), "{plan}");
    }
}

#[test]
fn gradients_reach_the_fused_projection_through_the_views() {
    let (b, n, d) = (2, 7, 4);
    for (h, hkv) in [(2, 2), (4, 1)] {
        let width = (h + 2 * hkv) * d;
        let qkv = Tensor::from_vec(values(b * n * width, 3), &[b * n, width]);
        let w = Tensor::from_vec(values(b * h * n * d, 4), &[b, h, n, d]);
        let dims = [b, n, d];
        let split = |t: &Tensor| {
            (heads_of(t, dims, 0, h), heads_of(t, dims, h, hkv), heads_of(t, dims, h + hkv, hkv))
        };
        let loss_of = |o: &Tensor| (o * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false);
        let (q, k, v) = split(&qkv);
        let in_place =
            gradient(&loss_of(&scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap()), &[&qkv]);
        // The same node on materialized copies (the dense path).
        let copied =
            scaled_dot_product_attention(&q.staged(), &k.staged(), &v.staged(), None, true, None).unwrap();
        let reference = gradient(&loss_of(&copied), &[&qkv]);
        let (a, r) = (
            in_place.unwrap()[0].to_ndarray::<f32>().unwrap(),
            reference.unwrap()[0].to_ndarray::<f32>().unwrap(),
        );
        let diff = (&a - &r).mapv(f32::abs).iter().copied().fold(0.0, f32::max);
        assert!(diff < 1e-5, "H {h} H_kv {hkv}: {diff}");
        assert!(a.iter().filter(|x| x.abs() > 1e-3).count() > a.len() / 2, "H {h} H_kv {hkv}: mostly zero");
        if h == hkv {
            // And against autograd of the unfused graph.
            let plain = uopc_tensor::masked::attention_masked(&q, &k, &v, None, true);
            let g = gradient(&loss_of(&plain), &[&qkv]).unwrap()[0].to_ndarray::<f32>().unwrap();
            let diff = (&a - &g).mapv(f32::abs).iter().copied().fold(0.0, f32::max);
            assert!(diff < 1e-5, "unfused: {diff}");
        }
    }
}

#[test]
fn batch_axes_collapse_into_one_stride_and_views_that_do_not_are_copied() {
    let (h, n, d) = (2, 5, 4);
    let width = 3 * h * d;
    let x = values(2 * 3 * n * width, 5);
    let qkv = Tensor::from_vec(x.clone(), &[2, 3, n, width]);
    // (2, 3, H, n, D) views: two batch axes, or the same with its batch axes swapped.
    let part = |t: &Tensor, from: usize| {
        t.try_slice(-1, from * d, (from + h) * d)
            .and_then(|t| t.try_reshape(&[2, 3, n, h, d]))
            .and_then(|t| t.try_permute(&[0, 1, 3, 2, 4]))
            .unwrap()
    };
    let (q, k, v) = (part(&qkv, 0), part(&qkv, h), part(&qkv, 2 * h));
    let dims = [6, n, d];
    let host = |from| host_heads(&x, width, dims, from, h);
    let config = SdpaConfig::new(6, h, n, n, d);
    let want = reference_f64(&config, &host(0), &host(h), &host(2 * h), Extras::default());
    let out = scaled_dot_product_attention(&q, &k, &v, None, false, None).unwrap();
    assert_eq!(out.shape(), [2, 3, h, n, d]);
    let got = out.to_ndarray::<f32>().unwrap();
    assert!(max_err(got.as_standard_layout().as_slice().unwrap(), &want) < 2e-5);
    let reads = |out: &Tensor| {
        let plan = make_plan(&[out.uop().clone()], &RealizeOptions::default()).unwrap();
        let node = plan.kernels.iter().find(|k| k.name == "sdpa_flash_tile_ops").expect("the node");
        (node.args[..3].to_vec(), plan.to_string())
    };
    let (args, plan) = reads(&out);
    assert_eq!(args, [ArgSource::Input(0); 3], "{plan}");
    // Swapped batch axes step by no single stride: copies, and the same values reordered.
    let swap = |t: &Tensor| t.try_permute(&[1, 0, 2, 3, 4]).unwrap();
    let out = scaled_dot_product_attention(&swap(&q), &swap(&k), &swap(&v), None, false, None).unwrap();
    let (args, plan) = reads(&out);
    assert!(args.iter().all(|a| matches!(a, ArgSource::Temp(_))), "{plan}");
    let got = swap(&out).to_ndarray::<f32>().unwrap();
    assert!(max_err(got.as_standard_layout().as_slice().unwrap(), &want) < 2e-5);
}

#[test]
fn bf16_heads_are_read_in_place_too() {
    let (b, h, hkv, n, d) = (2, 4, 2, 11, 8);
    let width = (h + 2 * hkv) * d;
    // Values exact in bf16, so the host copies are the kernel's inputs.
    let x: Vec<f32> = values(b * n * width, 7).iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
    let qkv32 = Tensor::from_vec(x.clone(), &[b * n, width]);
    let qkv = qkv32.cast(uopc_ir::DType::BF16);
    let dims = [b, n, d];
    let (q, k, v) =
        (heads_of(&qkv, dims, 0, h), heads_of(&qkv, dims, h, hkv), heads_of(&qkv, dims, h + hkv, hkv));
    let out = scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap();
    assert_eq!((out.shape(), out.dtype()), (&[b, h, n, d][..], uopc_ir::DType::BF16));
    let host = |from, heads| host_heads(&x, width, dims, from, heads);
    let config = SdpaConfig { kv_heads: hkv, causal: true, ..SdpaConfig::new(b, h, n, n, d) };
    let want = reference_f64(&config, &host(0, h), &host(h, hkv), &host(h + hkv, hkv), Extras::default());
    let got = out.cast(uopc_ir::DType::F32).to_ndarray::<f32>().unwrap();
    // One bf16 rounding of a value in [-1, 1], plus the f32 kernel's error: 2^-8.
    assert!(max_err(got.as_standard_layout().as_slice().unwrap(), &want) < 4e-3);
    let plan = make_plan(&[out.uop().clone()], &RealizeOptions::default()).unwrap();
    let node = plan.kernels.iter().find(|k| k.name == "sdpa_flash_tile_ops").expect("the node");
    let base = node.args[0];
    assert!(node.args[..3].iter().all(|a| *a == base), "{plan}");
    // The gradient reaches the projection's output as the node on copies gives it.
    let w = Tensor::from_vec(values(b * h * n * d, 8), &[b, h, n, d]);
    let loss_of = |o: &Tensor| {
        (&o.cast(uopc_ir::DType::F32) * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false)
    };
    let in_place = gradient(&loss_of(&out), &[&qkv32]).unwrap()[0].to_ndarray::<f32>().unwrap();
    let copied =
        scaled_dot_product_attention(&q.staged(), &k.staged(), &v.staged(), None, true, None).unwrap();
    let reference = gradient(&loss_of(&copied), &[&qkv32]).unwrap()[0].to_ndarray::<f32>().unwrap();
    let diff = (&in_place - &reference).mapv(f32::abs).iter().copied().fold(0.0, f32::max);
    assert!(diff < 1e-6, "{diff}");
    assert!(in_place.iter().filter(|x| x.abs() > 1e-3).count() > in_place.len() / 2, "mostly zero");
}

#[test]
fn heads_outside_rows_keep_the_output_heads_first() {
    // q, k and v as the two halves and a slice of (B, H, n, 2D) tensors: each row a view with
    // heads outside rows, so the output is written (B, H, n, D).
    let (b, h, n, d) = (2, 3, 9, 4);
    let len = b * h * n * 2 * d;
    let (xa, xb) = (values(len, 21), values(len, 22));
    let (ta, tb) =
        (Tensor::from_vec(xa.clone(), &[b, h, n, 2 * d]), Tensor::from_vec(xb.clone(), &[b, h, n, 2 * d]));
    let half = |t: &Tensor, from: usize| t.try_slice(-1, from, from + d).unwrap();
    let (q, k, v) = (half(&ta, 0), half(&ta, d), half(&tb, d));
    let host = |x: &[f32], from: usize| -> Vec<f32> {
        x.chunks(2 * d).flat_map(|row| row[from..from + d].to_vec()).collect()
    };
    let w = Tensor::from_vec(values(b * h * n * d, 23), &[b, h, n, d]);
    let loss_of = |o: &Tensor| (o * &w).sum(-1, false).sum(-1, false).sum(-1, false).sum(-1, false);
    let out = scaled_dot_product_attention(&q, &k, &v, None, false, None).unwrap();
    let config = SdpaConfig::new(b, h, n, n, d);
    let want = reference_f64(&config, &host(&xa, 0), &host(&xa, d), &host(&xb, d), Extras::default());
    let got = out.to_ndarray::<f32>().unwrap();
    assert!(max_err(got.as_standard_layout().as_slice().unwrap(), &want) < 2e-5);
    let plan = make_plan(&[out.uop().clone()], &RealizeOptions::default()).unwrap();
    let node = plan.kernels.iter().find(|k| k.name == "sdpa_flash_tile_ops").expect("the node");
    assert_eq!(node.args[..3], [ArgSource::Input(0), ArgSource::Input(0), ArgSource::Input(1)], "{plan}");
    // Its gradient, as the node's on copies gives it.
    let in_place = gradient(&loss_of(&out), &[&ta, &tb]).unwrap();
    let copied =
        scaled_dot_product_attention(&q.staged(), &k.staged(), &v.staged(), None, false, None).unwrap();
    let reference = gradient(&loss_of(&copied), &[&ta, &tb]).unwrap();
    for (a, r) in in_place.iter().zip(&reference) {
        let (a, r) = (a.to_ndarray::<f32>().unwrap(), r.to_ndarray::<f32>().unwrap());
        let diff = (&a - &r).mapv(f32::abs).iter().copied().fold(0.0, f32::max);
        assert!(diff < 1e-5, "{diff}");
        assert!(a.iter().any(|x| x.abs() > 1e-3), "the gradient is not trivially zero");
    }
}
