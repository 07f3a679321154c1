//! Elementwise kernels that end in GELU (exact or its tanh form) or SiLU, or multiply one by
//! another value (a gated unit), run the activation on `TILE_ACTIVATION`, one call per row
//! after a loop wrote the row's argument; kernels of other shapes or dtypes keep the loop.
//! Values against f64 either way.

use crate::common::*;
use half::bf16;
use ndarray::ArrayD;
use uopc_ir::{DType, Op, TileOp, UnaryOp};
use uopc_tensor::*;

/// The activation tile ops of the plan's one kernel, whether its loops take an exponential,
/// and the lowering that made it.
fn lowered(t: &Tensor) -> (Vec<uopc_tile::Activation>, bool, &'static str) {
    let plan = make_plan(&[t.uop().clone()], &RealizeOptions::default()).expect("plans");
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    let k = &plan.kernels[0];
    let nodes = uopc_ir::UOp::toposort(std::slice::from_ref(&k.program));
    let kinds = nodes
        .iter()
        .filter_map(|u| match u.op() {
            Op::Tile(TileOp::Activation { kind, .. }) => Some(*kind),
            _ => None,
        })
        .collect();
    let exp2 = nodes.iter().any(|u| matches!(u.op(), Op::Unary(UnaryOp::Exp2)));
    (kinds, exp2, k.lowering)
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn gelu_and_silu_kernels_run_the_tile_op_per_row() {
    let x = uniform(&[37, 300], -6.0, 6.0, 1);
    let t = Tensor::from_array(&x);
    let gelu = t.gelu_tanh();
    assert_eq!(lowered(&gelu), (vec![uopc_tile::Activation::GeluTanh], false, "activation_rows"));
    assert_close(&gelu.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(gelu64), 1e-5);
    // The argument is the loop's: a scaled input, then SiLU.
    let silu = (&t * 0.5).silu();
    assert_eq!(lowered(&silu), (vec![uopc_tile::Activation::Silu], false, "activation_rows"));
    assert_close(&silu.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(|v| silu64(0.5 * v)), 1e-5);
}

#[test]
fn gated_activations_run_the_tile_op_per_row_then_multiply() {
    let (g, u) = (uniform(&[3, 11, 200], -6.0, 6.0, 5), uniform(&[3, 11, 200], -2.0, 2.0, 6));
    let (tg, tu) = (Tensor::from_array(&g), Tensor::from_array(&u));
    // SwiGLU's `silu(gate) * up`, rows under two leading axes.
    let swiglu = tg.silu() * &tu;
    assert_eq!(lowered(&swiglu), (vec![uopc_tile::Activation::Silu], false, "gated_activation_rows"));
    let want = &f64s(&g).mapv(silu64) * &f64s(&u);
    assert_close(&swiglu.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    // GeGLU with the factors the other way round, rounded to bf16 once, at the end.
    let geglu = (&tu * &tg.gelu_tanh()).cast(DType::BF16);
    assert_eq!(lowered(&geglu), (vec![uopc_tile::Activation::GeluTanh], false, "gated_activation_rows"));
    let want = &f64s(&g).mapv(gelu64) * &f64s(&u);
    for (got, want) in geglu.to_ndarray::<bf16>().unwrap().iter().zip(want.iter()) {
        // Half a bf16 ulp of the rounding, plus the f32 activation's error.
        let tol = want.abs() / 256.0 + 1e-5;
        assert!((f64::from(got.to_f32()) - want).abs() <= tol, "{got} vs {want}");
    }
    // Rounded to f16 once: half an f16 ulp (2^-11 relative) plus the activation's error.
    let swiglu16 = (tg.silu() * &tu).cast(DType::F16);
    assert_eq!(lowered(&swiglu16).2, "gated_activation_rows");
    let want = &f64s(&g).mapv(silu64) * &f64s(&u);
    for (got, want) in swiglu16.to_ndarray::<half::f16>().unwrap().iter().zip(want.iter()) {
        let tol = want.abs() / 2048.0 + 1e-5;
        assert!((f64::from(got.to_f32()) - want).abs() <= tol, "{got} vs {want}");
    }
}

#[test]
fn other_kernels_keep_their_loops_and_their_values() {
    let x = uniform(&[24, 40], -6.0, 6.0, 2);
    let t = Tensor::from_array(&x);
    // Neither an activation nor a gated one: the loop computes it.
    let shifted = t.gelu_tanh() + 3.0;
    let (kinds, _, lowering) = lowered(&shifted);
    assert!(kinds.is_empty() && lowering == "rangeify");
    assert_close(&shifted.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(|v| gelu64(v) + 3.0), 1e-5);
    // Scaled, it is gated by a constant: the tile op, then the product.
    let scaled = t.gelu_tanh() * 3.0;
    assert_eq!(lowered(&scaled).2, "gated_activation_rows");
    assert_close(&scaled.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(|v| 3.0 * gelu64(v)), 1e-5);
    // A transposed argument: whichever lowering takes it, the values hold.
    let transposed = t.permute(&[1, 0]).gelu_tanh();
    let want = f64s(&x).permuted_axes(vec![1, 0]).mapv(gelu64);
    assert_close(&transposed.to_ndarray::<f32>().unwrap(), &want, 1e-5);
    // A bf16 activation rounds its f32 result: the loop does.
    let xb: ArrayD<bf16> = x.mapv(bf16::from_f32);
    let b = Tensor::from_array(&xb).silu();
    assert!(lowered(&b).0.is_empty());
    for (got, v) in b.to_ndarray::<bf16>().unwrap().iter().zip(xb.iter()) {
        let want = silu64(f64::from(v.to_f32()));
        assert!((f64::from(got.to_f32()) - want).abs() <= (1.0 + want.abs()) / 256.0, "{got} vs {want}");
    }
}

/// `a @ b` in f64 for 2-D arrays.
fn mm64(a: &ndarray::Array2<f64>, b: &ndarray::Array2<f64>) -> ndarray::Array2<f64> {
    a.dot(b)
}

fn gelu_slope64(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let t = (c * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
}

fn exact_gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn exact_gelu_slope64(x: f64) -> f64 {
    let density = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * density
}

#[test]
fn an_exact_gelu_kernel_runs_the_tile_op_per_row() {
    // |x| up to 8: both of erf's fits and its saturation.
    let x = uniform(&[29, 257], -8.0, 8.0, 4);
    let gelu = Tensor::from_array(&x).gelu();
    assert_eq!(lowered(&gelu), (vec![uopc_tile::Activation::Gelu], false, "activation_rows"));
    // The tile op's lower tail is erfc itself where the graph's `1 + erf` cancels: against the
    // f64 function both are within 1e-5 of 1 + |want|.
    assert_close(&gelu.to_ndarray::<f32>().unwrap(), &f64s(&x).mapv(exact_gelu64), 1e-5);
}

#[test]
fn a_training_steps_gelu_gradient_runs_on_the_tile_op_in_the_gemm_epilogue() {
    training_step_gradient_on_the_tile_op(Tensor::gelu_tanh, uopc_tile::Activation::GeluTanh, gelu_slope64);
    training_step_gradient_on_the_tile_op(Tensor::gelu, uopc_tile::Activation::Gelu, exact_gelu_slope64);
}

/// A two-layer step's gradients for x, w1 and b1 through `act` (whose derivative is `slope`),
/// with the activation's backward on `kind`'s gradient tile op, against f64.
fn training_step_gradient_on_the_tile_op(
    act: fn(&Tensor) -> Tensor,
    kind: uopc_tile::Activation,
    slope: fn(f64) -> f64,
) {
    let (n, k, h, m) = (48, 40, 96, 24);
    let two = |a: ArrayD<f32>| f64s(&a).into_dimensionality::<ndarray::Ix2>().unwrap();
    let (x, w1, w2, r) = (
        uniform(&[n, k], -1.0, 1.0, 31),
        uniform(&[k, h], -1.0, 1.0, 32),
        uniform(&[h, m], -1.0, 1.0, 33),
        uniform(&[n, m], -1.0, 1.0, 34),
    );
    let b1 = uniform(&[h], -1.0, 1.0, 35);
    let (tx, tw1, tb1, tw2, tr) = (
        Tensor::from_array(&x),
        Tensor::from_array(&w1),
        Tensor::from_array(&b1),
        Tensor::from_array(&w2),
        Tensor::from_array(&r),
    );
    // The gradient arriving at the GELU is r @ w2^T, a GEMM: its epilogue is the GELU's backward.
    let loss = (act(&(tx.matmul(&tw1) + &tb1)).matmul(&tw2) * &tr).sum(0, false).sum(0, false);
    let grads = loss.gradient(&[&tx, &tw1, &tb1]).unwrap();
    let roots: Vec<uopc_ir::UOp> = grads.iter().map(|g| g.uop().clone()).collect();
    let plan = make_plan(&roots, &RealizeOptions::default()).expect("plans");
    let grad_ops = plan
        .kernels
        .iter()
        .flat_map(|k| uopc_ir::UOp::toposort(std::slice::from_ref(&k.program)))
        .filter(|u| matches!(u.op(), Op::Tile(TileOp::ActivationGrad { kind: got, .. }) if *got == kind))
        .count();
    assert!(grad_ops >= 1, "{kind:?}: {plan}");
    // f64: pre = x w1 + b1, dpre = (r w2^T) * gelu'(pre), then the three gradients.
    let (x, w1, w2, r) = (two(x), two(w1), two(w2), two(r));
    let b1 = f64s(&b1);
    let mut pre = mm64(&x, &w1);
    for mut row in pre.rows_mut() {
        for (v, b) in row.iter_mut().zip(b1.iter()) {
            *v += b;
        }
    }
    let dy = mm64(&r, &w2.t().to_owned());
    let dpre = &dy * &pre.mapv(slope);
    let want = [mm64(&dpre, &w1.t().to_owned()), mm64(&x.t().to_owned(), &dpre)];
    for (g, w) in grads.iter().zip(&want) {
        assert_close(&g.to_ndarray::<f32>().unwrap(), &w.clone().into_dyn(), 1e-4);
    }
    let db = dpre.sum_axis(ndarray::Axis(0)).into_dyn();
    assert_close(&grads[2].to_ndarray::<f32>().unwrap(), &db, 1e-4);
}

/// The lowering of the plan's one kernel.
fn lowering_of(t: &Tensor) -> &'static str {
    let plan = make_plan(&[t.uop().clone()], &RealizeOptions::default()).expect("plans");
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    plan.kernels[0].lowering
}

#[test]
fn conversions_between_f32_and_16_bit_rows_run_the_conversion_tile_op() {
    let x = uniform(&[5, 7, 300], -4.0, 4.0, 8);
    let xb: ArrayD<bf16> = x.mapv(bf16::from_f32);
    // Widening a bf16 tensor: a copy, row by row, exact.
    let wide = Tensor::from_array(&xb).cast(DType::F32);
    assert_eq!(lowering_of(&wide), "convert_rows");
    assert_eq!(wide.to_ndarray::<f32>().unwrap(), xb.mapv(|v| v.to_f32()));
    // Rounding an f32 tensor: half's round-to-nearest-even, bit for bit.
    let narrow = Tensor::from_array(&x).cast(DType::BF16);
    assert_eq!(lowering_of(&narrow), "convert_rows");
    assert_eq!(narrow.to_ndarray::<bf16>().unwrap(), xb);
    // A transposed source is not one run per row: the loop converts it, with the same values.
    let transposed = Tensor::from_array(&x).permute(&[2, 1, 0]).cast(DType::BF16);
    assert_ne!(lowering_of(&transposed), "convert_rows");
    assert_eq!(transposed.to_ndarray::<bf16>().unwrap(), xb.clone().permuted_axes(vec![2, 1, 0]));
    // Rows narrower than a vector keep the loop.
    let narrow_rows = Tensor::from_array(&uniform(&[40, 3], -4.0, 4.0, 9)).cast(DType::BF16);
    assert_eq!(lowering_of(&narrow_rows), "rangeify");
    // An f32 value rounded at the end: computed into a row, then rounded by the tile op, each
    // element exactly the rounding of the f32 arithmetic.
    let t = Tensor::from_array(&x);
    let rounded = (&t * 0.75 + 0.5).cast(DType::BF16);
    assert_eq!(lowering_of(&rounded), "rounded_rows");
    let want = x.mapv(|v| bf16::from_f32(v * 0.75 + 0.5));
    assert_eq!(rounded.to_ndarray::<bf16>().unwrap(), want);
    let rounded16 = (&t * 0.75 + 0.5).cast(DType::F16);
    assert_eq!(lowering_of(&rounded16), "rounded_rows");
    assert_eq!(rounded16.to_ndarray::<half::f16>().unwrap(), x.mapv(|v| half::f16::from_f32(v * 0.75 + 0.5)));
}
