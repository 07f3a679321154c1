//! The Tensor-API GPT block against its independent f64 reference: the forward values, and
//! the gradient of every parameter and of the input against central differences of the f64
//! forward.

use ndarray::ArrayD;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::Tensor;
use uopc::gpt::{GptBlock, GptConfig, reference_forward_f64};

const CONFIG: GptConfig = GptConfig { d_model: 64, heads: 4, hidden: 256, eps: 1e-5 };
const SHAPE: [usize; 3] = [2, 32, 64];

fn random(shape: &[usize], scale: f32, seed: u64) -> ArrayD<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    ArrayD::from_shape_simple_fn(shape.to_vec(), || rng.random_range(-scale..scale))
}

/// A block whose LayerNorm parameters and biases are random too, so every gradient is exercised
/// away from the initialization's special values.
fn block() -> GptBlock {
    GptBlock::random(CONFIG, 3).unwrap().map_params(|p, k| {
        let noise = random(p.shape(), 0.1, 100 + k as u64);
        let base = p.to_ndarray::<f32>().unwrap();
        Tensor::from_array(&(base + noise))
    })
}

#[test]
fn forward_matches_the_f64_reference() {
    let block = block();
    let x = random(&SHAPE, 1.0, 1);
    let got = block.forward(&Tensor::from_array(&x)).unwrap().to_ndarray::<f32>().unwrap();
    let want = reference_forward_f64(&block, &x).unwrap();
    let err = got.iter().zip(want.iter()).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
    // Outputs are O(1); every value passes through sums of at most 256 f32 products.
    assert!(err < 2e-4, "max abs error {err}");
}

#[test]
fn forward_rejects_a_wrong_width() {
    let err = block().forward(&Tensor::full(&[2, 8, 48], 1.0)).unwrap_err();
    assert!(err.to_string().contains("width 48"), "{err}");
    assert!(block().forward(&Tensor::full(&[8, 64], 1.0)).is_err());
}

/// `sum(forward(x) * weights)` in f64 with the block's parameter `k` (or x, for `k == 12`)
/// changed at flat index `i` by `delta`; returns the value and the delta actually applied
/// (after rounding to f32).
fn perturbed_loss(
    block: &GptBlock,
    x: &ArrayD<f32>,
    weights: &ArrayD<f64>,
    k: usize,
    i: usize,
    delta: f32,
) -> (f64, f64) {
    let mut applied = 0.0;
    let mut bump = |a: &ArrayD<f32>| {
        let mut a = a.clone();
        let old = a.as_slice().unwrap()[i];
        let new = old + delta;
        applied = f64::from(new) - f64::from(old);
        a.as_slice_mut().unwrap()[i] = new;
        a
    };
    let (b, xs) = if k == 12 {
        (block.clone(), bump(x))
    } else {
        let b = block.map_params(|p, j| {
            if j == k { Tensor::from_array(&bump(&p.to_ndarray::<f32>().unwrap())) } else { p.clone() }
        });
        (b, x.clone())
    };
    let y = reference_forward_f64(&b, &xs).unwrap();
    ((y * weights).sum(), applied)
}

#[test]
fn gradients_of_every_parameter_and_the_input_match_central_differences() {
    let block = block();
    let x = random(&SHAPE, 1.0, 2);
    let weights32 = random(&SHAPE, 1.0, 4);
    let weights = weights32.mapv(f64::from);
    let xt = Tensor::from_array(&x);
    let y = block.forward(&xt).unwrap();
    let n: usize = SHAPE.iter().product();
    let loss = (&y * &Tensor::from_array(&weights32)).reshape(&[n]).sum(0, false);
    let mut params = block.params();
    params.push(&xt);
    let grads = uopc::tensor::gradient(&loss, &params).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    for (k, g) in grads.iter().enumerate() {
        let g = g.to_ndarray::<f32>().unwrap();
        let scale = g.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
        for _ in 0..3 {
            let i = rng.random_range(0..g.len());
            let h = 1.0 / 256.0;
            let (up, du) = perturbed_loss(&block, &x, &weights, k, i, h);
            let (down, dd) = perturbed_loss(&block, &x, &weights, k, i, -h);
            let numeric = (up - down) / (du - dd);
            let analytic = f64::from(g.as_slice().unwrap()[i]);
            // Central differences are exact to O(h^2) in f64; the analytic gradient carries f32
            // rounding through two attention passes: 1% of the largest entry of this gradient.
            assert!(
                (analytic - numeric).abs() <= 1e-2 * scale.max(1e-3),
                "parameter {k}, entry {i}: analytic {analytic}, numeric {numeric} (largest {scale})"
            );
        }
    }
}

#[test]
fn the_plans_compute_the_mlp_epilogues_on_their_gemm_blocks() {
    // The QKV projection's bias, the first MLP layer's bias and GELU, and the second's bias and
    // the residual add, run on the output blocks of their tile GEMMs; the attention projection
    // (read by LayerNorm's reductions too) stays plain.
    let block = block();
    let y = block.forward(&Tensor::from_array(&random(&SHAPE, 1.0, 1))).unwrap();
    let plan = uopc::tensor::make_plan(&[y.uop().clone()], &uopc::RealizeOptions::default()).unwrap();
    let epilogues: Vec<&str> =
        plan.kernels.iter().filter(|k| k.has_epilogue()).map(|k| k.name.as_str()).collect();
    assert_eq!(epilogues, ["r_64_192", "r_64_256", "r_2_32_64"], "{plan}");
    assert!(plan.kernels.iter().filter(|k| k.has_epilogue()).all(|k| k.uses_tile_ops()));
    let plain: Vec<&str> = plan
        .kernels
        .iter()
        .filter(|k| k.uses_tile_ops() && !k.has_epilogue() && k.name.starts_with("r_"))
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(plain, ["r_64_64"], "{plan}");
    // No copies around attention: it reads q, k and v in the QKV projection's output, and the
    // output projection reads its output.
    let at = |name: &str| plan.kernels.iter().position(|k| k.name == name).unwrap();
    let (qkv, attention, projection) = (at("r_64_192"), at("sdpa_flash_tile_ops"), at("r_64_64"));
    assert_eq!((qkv + 1, attention + 1), (attention, projection), "{plan}");
    let written = plan.kernels[qkv].args.last().unwrap();
    assert!(plan.kernels[attention].args[..3].iter().all(|a| a == written), "{plan}");
    assert_eq!(plan.kernels[projection].args[0], *plan.kernels[attention].args.last().unwrap(), "{plan}");
    // Forward plus backward: the QKV projection keeps its bias epilogue; the pre-activation is
    // read again by the backward pass, so the first layer's GEMM stays plain; the input
    // gradient of the GELU, (dy W2^T) * gelu'(h), is the epilogue of the GEMM that computes
    // dy W2^T.
    let n: usize = SHAPE.iter().product();
    let loss = (&y * &Tensor::from_array(&random(&SHAPE, 1.0, 4))).reshape(&[n]).sum(0, false);
    let grads = uopc::tensor::gradient(&loss, &block.params()).unwrap();
    let roots: Vec<_> = grads.iter().map(|g| g.uop().clone()).collect();
    let plan = uopc::tensor::make_plan(&roots, &uopc::RealizeOptions::default()).unwrap();
    let epilogues: Vec<&str> =
        plan.kernels.iter().filter(|k| k.has_epilogue()).map(|k| k.name.as_str()).collect();
    assert_eq!(epilogues, ["r_64_192", "r_64_256"], "{plan}");
}
